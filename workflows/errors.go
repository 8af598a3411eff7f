package workflows

import (
	"fmt"

	"go.temporal.io/sdk/temporal"

	"github.com/gauntlet-rl/gauntlet/pkg/errkind"
)

// ErrTypeNotFound is the error type of a non-retryable activity failure over something
// that does not exist.
const ErrTypeNotFound = "NotFound"

// activityError is err, an error that crossed NATS with its kind, as an activity returns
// it to Temporal, prefixed by what failed: an invalid request is a non-retryable
// application error of type ErrTypeInvalidSpec, something not found one of type
// ErrTypeNotFound; anything else (unavailable, internal) stays retryable, so Temporal
// retries the activity with its backoff. This is the only place workflows turn error
// kinds into Temporal's terms.
func activityError(what string, err error) error {
	switch errkind.Of(err) {
	case errkind.Invalid:
		return temporal.NewNonRetryableApplicationError(fmt.Sprintf("%s: %v", what, err), ErrTypeInvalidSpec, err)
	case errkind.NotFound:
		return temporal.NewNonRetryableApplicationError(fmt.Sprintf("%s: %v", what, err), ErrTypeNotFound, err)
	default:
		return fmt.Errorf("%s: %w", what, err)
	}
}
