package envapi

import (
	"fmt"
	"testing"

	"connectrpc.com/connect"

	"github.com/gauntlet-rl/gauntlet/pkg/errkind"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// A plan error reaches the trainer with the code its kind says, whatever its text: an
// unknown profile is the caller's to fix, a bucket that timed out is worth a retry.
func TestPlanErrorKindsMapToConnectCodes(t *testing.T) {
	for _, c := range []struct {
		kind gauntletv1.ErrorKind
		want connect.Code
	}{
		{gauntletv1.ErrorKind_ERROR_KIND_INVALID, connect.CodeInvalidArgument},
		{gauntletv1.ErrorKind_ERROR_KIND_UNSPECIFIED, connect.CodeInvalidArgument}, // an older faults service
		{gauntletv1.ErrorKind_ERROR_KIND_NOT_FOUND, connect.CodeNotFound},
		{gauntletv1.ErrorKind_ERROR_KIND_UNAVAILABLE, connect.CodeUnavailable},
		{gauntletv1.ErrorKind_ERROR_KIND_INTERNAL, connect.CodeInternal},
	} {
		err := connectError(fmt.Errorf("fault plan: %w", errkind.FromReply("global drift: get gauntlet_drift/global: timeout", c.kind)))
		if err.Code() != c.want {
			t.Errorf("%v: code %v, want %v", c.kind, err.Code(), c.want)
		}
	}
}
