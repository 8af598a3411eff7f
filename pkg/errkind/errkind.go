package errkind

import (
	"errors"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Kind is what kind of failure an error is.
type Kind uint8

// The kinds. Other is an error nobody classified; across NATS it travels as Internal.
const (
	Other Kind = iota
	// Invalid: the request cannot succeed as it is (a bad spec, an unknown profile).
	Invalid
	// NotFound: something the request names does not exist.
	NotFound
	// Unavailable: a dependency failed or timed out; the same request may succeed later.
	Unavailable
	// Internal: a component broke its own contract (a bug).
	Internal
)

var names = [...]string{Other: "other", Invalid: "invalid", NotFound: "not found", Unavailable: "unavailable", Internal: "internal"}

// String names the kind.
func (k Kind) String() string {
	if int(k) < len(names) {
		return names[k]
	}
	return "unknown kind"
}

// Error is an error of a kind. Its text is its cause's: the kind travels beside it.
type Error struct {
	Kind Kind
	Err  error
}

// Error returns the cause's text.
func (e *Error) Error() string { return e.Err.Error() }

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// E returns err marked with kind k (nil for a nil err). Wrapping it further with
// fmt.Errorf("...: %w", err) keeps the kind.
func E(k Kind, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Kind: k, Err: err}
}

// Of returns the kind of the outermost kinded error in err's chain, Other if there is none
// (or err is nil).
func Of(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return Other
}

// Is reports whether err is of kind k.
func Is(k Kind, err error) bool { return err != nil && Of(err) == k }

// Proto is the kind on the wire; Other travels as internal.
func (k Kind) Proto() gauntletv1.ErrorKind {
	switch k {
	case Invalid:
		return gauntletv1.ErrorKind_ERROR_KIND_INVALID
	case NotFound:
		return gauntletv1.ErrorKind_ERROR_KIND_NOT_FOUND
	case Unavailable:
		return gauntletv1.ErrorKind_ERROR_KIND_UNAVAILABLE
	default:
		return gauntletv1.ErrorKind_ERROR_KIND_INTERNAL
	}
}

// FromProto is the kind of a wire kind. Unspecified (a sender that predates kinds, whose
// errors callers took as final) is Invalid, so such errors stay final.
func FromProto(k gauntletv1.ErrorKind) Kind {
	switch k {
	case gauntletv1.ErrorKind_ERROR_KIND_NOT_FOUND:
		return NotFound
	case gauntletv1.ErrorKind_ERROR_KIND_UNAVAILABLE:
		return Unavailable
	case gauntletv1.ErrorKind_ERROR_KIND_INTERNAL:
		return Internal
	default:
		return Invalid
	}
}

// Reply is err as a reply carries it: its text and its kind (empty and unspecified for a
// nil err).
func Reply(err error) (string, gauntletv1.ErrorKind) {
	if err == nil {
		return "", gauntletv1.ErrorKind_ERROR_KIND_UNSPECIFIED
	}
	return err.Error(), Of(err).Proto()
}

// FromReply is the error a reply carries, of its kind; nil when text is empty.
func FromReply(text string, k gauntletv1.ErrorKind) error {
	if text == "" {
		return nil
	}
	return &Error{Kind: FromProto(k), Err: errors.New(text)}
}
