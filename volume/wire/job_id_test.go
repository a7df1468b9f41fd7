package wire

import "testing"

func TestSetJobIDStampsRequestsJobOfReads(t *testing.T) {
	for _, m := range []Message{&RegionInfoRequest{}, &ExtentVersionsRequest{}, &Write{}, &Read{}, &Flush{},
		&ExtentHashesRequest{}, &RepairRead{}, &RepairWrite{}} {
		if !SetJobID(m, 42) {
			t.Errorf("SetJobID(%v) = false, want true", m.Type())
		}
		if id, ok := JobOf(m); !ok || id != 42 {
			t.Errorf("JobOf(%v) = %d, %v after SetJobID(42)", m.Type(), id, ok)
		}
	}
	for _, m := range []Message{&Hello{}, &Activate{}, &Ack{}, &ReadResponse{}} {
		if SetJobID(m, 42) {
			t.Errorf("SetJobID(%v) = true for a message that is no call", m.Type())
		}
	}
}
