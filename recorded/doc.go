// Package recorded owns the recorded-gradients format: the gradients of P
// data-parallel workers over S consecutive training steps, recorded from
// any PyTorch training (python/sparsegrad_record.py) or from train itself
// (-record-gradients), so that the sparsifiers can be judged on a model the
// project does not have (train replay, train advise -gradients, train
// sweep -gradients).
//
// A recording is a folder:
//
//	manifest.json                        what was recorded (Manifest)
//	step-000001/rank-00000.safetensors   worker 0's gradient at step 1
//	step-000001/rank-00001.safetensors   ...
//	step-000002/...
//
// Each file holds one tensor per parameter, named as the parameter, of the
// parameter's shape, of type F32, F16 or BF16 (F64 is read too); together,
// in the manifest's parameter order, they are the flat gradient in the
// project's layout (models.ParamInfo: name, shape, offset, size). The
// manifest says the model's name, P, S, the per-worker batch, the
// measured time of one worker's forward and backward pass and its device,
// and the software that recorded it. It is rewritten after every complete
// step, so a recording cut short holds the steps done.
//
// The safetensors reader checks every header it reads (ParseHeader) and is
// fuzzed (FuzzParseHeader).
package recorded
