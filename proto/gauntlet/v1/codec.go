package gauntletv1

import "google.golang.org/protobuf/proto"

// The hot path's codec. Every message here also has vtprotobuf's generated
// MarshalVT/UnmarshalVT (the *_vtproto.pb.go files, `make proto`), which encode and decode
// without protobuf-go's reflection: in the pipeline's profile, protobuf was a quarter of
// the CPU (docs/benchmarks.md). The bytes are the same protobuf either way. Unlike
// proto.Unmarshal, UnmarshalVT does not check that strings are valid UTF-8: messages on
// the bus come from gauntlet's own processes, and untrusted input (the env API) is
// decoded and checked by protobuf-go where it enters.

// Marshal encodes m, through its generated MarshalVT when it has one. An Event's
// segments (alone or in a batch) are written with their steps' scores in the compact
// form (StepScored.spec and values against StepsTaken.score_specs); m is left as it was,
// but it is changed while Marshal runs, so no other goroutine may read it meanwhile.
// Read a decoded segment's scores with StepsTaken.ScoreOf.
func Marshal(m proto.Message) ([]byte, error) {
	if ev, ok := m.(*Event); ok {
		if restore := compactEvent(ev); restore != nil {
			defer restore()
		}
	}
	if v, ok := m.(interface{ MarshalVT() ([]byte, error) }); ok {
		return v.MarshalVT()
	}
	return proto.Marshal(m)
}

// Unmarshal decodes b into m (reset first), through its generated UnmarshalVT when it
// has one.
func Unmarshal(b []byte, m proto.Message) error {
	if v, ok := m.(interface{ UnmarshalVT([]byte) error }); ok {
		proto.Reset(m)
		return v.UnmarshalVT(b)
	}
	return proto.Unmarshal(b, m)
}

// UnmarshalAliasing is Unmarshal whose strings and bytes share b's memory instead of
// copying it (vtprotobuf's UnmarshalVTUnsafe): for a consumer that holds b, unchanged,
// for as long as it uses m, as the store does with a batch's messages.
func UnmarshalAliasing(b []byte, m proto.Message) error {
	if v, ok := m.(interface{ UnmarshalVTUnsafe([]byte) error }); ok {
		proto.Reset(m)
		return v.UnmarshalVTUnsafe(b)
	}
	return proto.Unmarshal(b, m)
}
