package workflows

import (
	"errors"
	"testing"

	"go.temporal.io/sdk/temporal"

	"github.com/gauntlet-rl/gauntlet/pkg/errkind"
)

// Only what cannot succeed on a retry stops Temporal retrying the activity.
func TestActivityErrorRetriesAllButInvalidAndNotFound(t *testing.T) {
	for _, c := range []struct {
		kind      errkind.Kind
		final     bool
		errorType string
	}{
		{errkind.Invalid, true, ErrTypeInvalidSpec},
		{errkind.NotFound, true, ErrTypeNotFound},
		{errkind.Unavailable, false, ""},
		{errkind.Internal, false, ""},
		{errkind.Other, false, ""},
	} {
		cause := errkind.E(c.kind, errors.New("global drift: get gauntlet_drift/global: context deadline exceeded"))
		err := activityError("play episode e1: faults service cannot plan it", cause)
		var ae *temporal.ApplicationError
		final := errors.As(err, &ae) && ae.NonRetryable()
		if final != c.final || final && ae.Type() != c.errorType {
			t.Errorf("%v: %v (non-retryable %v), want non-retryable %v of type %q", c.kind, err, final, c.final, c.errorType)
		}
		if errkind.Of(err) != c.kind && c.kind != errkind.Other {
			t.Errorf("%v: the kind is lost in %v", c.kind, err)
		}
	}
}
