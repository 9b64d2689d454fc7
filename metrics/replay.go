package metrics

// Replay is what run.json says, under "replay", of the recording of
// gradients a replay (train replay) replayed: train writes it, reports
// reads it.
type Replay struct {
	// Dir is the recording's folder.
	Dir string `json:"dir"`
	// Model, Source, Mode, Workers, Steps and Batch are the recording
	// manifest's (package recorded).
	Model   string `json:"model"`
	Source  string `json:"source"`
	Mode    string `json:"mode"`
	Workers int    `json:"workers"`
	Steps   int    `json:"steps"`
	Batch   int    `json:"batch"`
	// StepTime is the recording's measured time of one worker's forward
	// and backward pass (seconds), StepDevice where it ran.
	StepTime   float64 `json:"step_time"`
	StepDevice string  `json:"step_device"`
	// Software is the manifest's (torch and Python versions, ...).
	Software map[string]string `json:"software,omitempty"`
}
