package envapi

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// strictJSON is the env API's JSON codec (Connect's HTTP/JSON and gRPC-Web's JSON): as
// connect's own, except that a field the message does not have is refused instead of
// dropped. Dropping it made careless requests misread, silently: "args" for "argsJson"
// became an empty, invalid action the episode was penalised for, and a misspelled
// trainer key lost the token data. A request naming a field this server does not know is
// InvalidArgument (HTTP 400) with protojson's message naming the field; a client newer
// than the server therefore learns that instead of being half-understood.
//
// The binary protobuf codec (gRPC) keeps proto's rule of carrying unknown fields along:
// those come from generated code, where a field cannot be misspelled.
type strictJSON struct{ name string }

// strictJSONCodecs are the names connect registers its JSON codec under; the env API
// replaces both.
var strictJSONCodecs = []strictJSON{{"json"}, {"json; charset=utf-8"}}

func (c strictJSON) Name() string   { return c.name }
func (c strictJSON) IsBinary() bool { return false }

func (c strictJSON) Marshal(m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("marshal %T: not a proto message", m)
	}
	return protojson.MarshalOptions{}.Marshal(pm)
}

// MarshalAppend lets connect reuse its buffers, as with its own codec.
func (c strictJSON) MarshalAppend(dst []byte, m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("marshal %T: not a proto message", m)
	}
	return protojson.MarshalOptions{}.MarshalAppend(dst, pm)
}

func (c strictJSON) Unmarshal(data []byte, m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return fmt.Errorf("unmarshal into %T: not a proto message", m)
	}
	if len(data) == 0 {
		return errors.New("zero-length payload is not a valid JSON object")
	}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(data, pm); err != nil {
		name := pm.ProtoReflect().Descriptor().Name()
		if strings.Contains(err.Error(), "unknown field") {
			return fmt.Errorf("%s: %w (fields take the proto's JSON names, e.g. argsJson, completionTokenIds; see docs/envapi.md)", name, err)
		}
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}
