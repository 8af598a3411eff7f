package envapi

import (
	"connectrpc.com/connect"

	"github.com/gauntlet-rl/gauntlet/pkg/errkind"
)

// connectError is err, an error that crossed NATS with its kind, as a trainer sees it: the
// kind decides the connect code (invalid: InvalidArgument, not found: NotFound,
// unavailable: Unavailable, so a client retries it; anything else: Internal). This is the
// only place the env API turns error kinds into connect codes.
func connectError(err error) *connect.Error {
	code := connect.CodeInternal
	switch errkind.Of(err) {
	case errkind.Invalid:
		code = connect.CodeInvalidArgument
	case errkind.NotFound:
		code = connect.CodeNotFound
	case errkind.Unavailable:
		code = connect.CodeUnavailable
	}
	return connect.NewError(code, err)
}
