package comm

import (
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/device"
)

// gpuKind is a device of another kind than the CPU whose memory is never
// touched (pick only looks at where buffers are).
type gpuKind struct{ device.Device }

func (gpuKind) Kind() device.Kind { return device.CUDAKind }
func (gpuKind) String() string    { return "gpu" }

func TestRoutePicksByMemory(t *testing.T) {
	host := Float32s(make([]float32, 8))
	// Two distinct communicators, never called: pick only chooses.
	r := &route{host: &Counter{}, dev: &Counter{}}
	g := device.NewDeviceBuffer(gpuKind{}, device.Float32, 8, 0x1000)
	onGPU := OnDevice(g, nil)
	empty := OnDevice(g.Slice(8, 8), nil) // a rank's empty share
	hostDev := OnDevice(device.Host(make([]float32, 8)), nil)
	tests := []struct {
		name    string
		bufs    []Buffer
		wantDev bool
		wantErr bool
	}{
		{"host slice", []Buffer{host}, false, false},
		{"host memory as a Device buffer", []Buffer{hostDev, host}, false, false},
		{"zero Device buffer", []Buffer{Device{}}, false, false},
		{"device memory", []Buffer{onGPU, onGPU}, true, false},
		{"empty share of device memory", []Buffer{empty, onGPU}, true, false},
		{"mixed", []Buffer{host, onGPU}, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := r.pick("AllGather", tc.bufs...)
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), "partly in host and partly in device memory") {
					t.Fatalf("err %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (c == r.dev) != tc.wantDev {
				t.Fatalf("picked the device communicator: %v, want %v", c == r.dev, tc.wantDev)
			}
		})
	}
}
