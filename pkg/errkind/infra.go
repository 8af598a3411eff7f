package errkind

import (
	"errors"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// infraError marks an error with what failed when it ends an episode as an infra error.
// Its text is its cause's.
type infraError struct {
	kind gauntletv1.InfraKind
	err  error
}

func (e *infraError) Error() string { return e.err.Error() }
func (e *infraError) Unwrap() error { return e.err }

// Infra returns err marked as a failure of k (the model endpoint, the sandbox, the
// verifier, gauntlet), nil for a nil err. Wrapping it further keeps the mark; the
// outermost mark wins. It is orthogonal to Kind: an unavailable endpoint is both.
func Infra(k gauntletv1.InfraKind, err error) error {
	if err == nil {
		return nil
	}
	return &infraError{kind: k, err: err}
}

// InfraOf returns what failed according to the outermost mark in err's chain (Infra), or
// unspecified when nothing marked it; nil gives unspecified.
func InfraOf(err error) gauntletv1.InfraKind {
	var e *infraError
	if errors.As(err, &e) {
		return e.kind
	}
	return gauntletv1.InfraKind_INFRA_KIND_UNSPECIFIED
}
