package gauntletv1

import (
	"bytes"
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// fill sets every field of m to a value that is not the default (each oneof to its
// member number pick, modulo its size), recursing into messages up to depth.
func fill(m protoreflect.Message, depth, pick int) {
	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if o := fd.ContainingOneof(); o != nil && !o.IsSynthetic() && o.Fields().Get(pick%o.Fields().Len()) != fd {
			continue
		}
		if fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind {
			if depth == 0 {
				continue
			}
			switch {
			case fd.IsList():
				l := m.Mutable(fd).List()
				for range 2 {
					e := l.NewElement()
					fill(e.Message(), depth-1, pick)
					l.Append(e)
				}
			case fd.IsMap():
				continue // gauntlet's messages have no maps of messages
			default:
				fill(m.Mutable(fd).Message(), depth-1, pick)
			}
			continue
		}
		v := scalar(fd, i)
		switch {
		case fd.IsList():
			l := m.Mutable(fd).List()
			l.Append(v)
			l.Append(scalar(fd, i+1))
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			mp.Set(scalar(fd.MapKey(), i).MapKey(), scalar(fd.MapValue(), i))
		default:
			m.Set(fd, v)
		}
	}
}

func scalar(fd protoreflect.FieldDescriptor, i int) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.EnumKind:
		vals := fd.Enum().Values()
		return protoreflect.ValueOfEnum(vals.Get(vals.Len() - 1).Number())
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(-7 - i))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(int64(-1<<40 - i))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(300 + i))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(uint64(1<<50 + i))
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(float32(i) + 0.25)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(float64(i) + 0.125)
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(fmt.Sprintf("s%d-ünï", i))
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte{0, byte(i), 0xff})
	}
	panic(fmt.Sprintf("field %s: kind %s", fd.FullName(), fd.Kind()))
}

// Every message of the wire contract encodes to the same bytes through the generated
// fast path as through protobuf-go, and decodes back to itself through Unmarshal and
// UnmarshalAliasing, for every member of every oneof.
func TestCodecMatchesProtobufGo(t *testing.T) {
	n := 0
	protoregistry.GlobalTypes.RangeMessages(func(mt protoreflect.MessageType) bool {
		if mt.Descriptor().ParentFile().Package() != "gauntlet.v1" {
			return true
		}
		for pick := range 4 {
			m := mt.New()
			fill(m, 4, pick)
			msg := m.Interface()
			want, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Marshal(msg)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s (oneof pick %d): Marshal differs from proto.Marshal", mt.Descriptor().FullName(), pick)
			}
			for name, dec := range map[string]func([]byte, proto.Message) error{"Unmarshal": Unmarshal, "UnmarshalAliasing": UnmarshalAliasing} {
				back := mt.New().Interface()
				if err := dec(bytes.Clone(want), back); err != nil {
					t.Fatalf("%s %s: %v", mt.Descriptor().FullName(), name, err)
				}
				if !proto.Equal(back, msg) {
					t.Errorf("%s (oneof pick %d): %s gave %v, want %v", mt.Descriptor().FullName(), pick, name, back, msg)
				}
			}
		}
		n++
		return true
	})
	if n < 40 {
		t.Fatalf("checked %d messages; the contract has more", n)
	}
}
