package errkind

import (
	"context"
	"errors"
	"fmt"
	"testing"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

func TestKindSurvivesWrappingAndTheWire(t *testing.T) {
	for _, k := range []Kind{Invalid, NotFound, Unavailable, Internal} {
		err := fmt.Errorf("plan episodes 0..15: %w", E(k, context.DeadlineExceeded))
		if Of(err) != k || !Is(k, err) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%v: Of = %v, Is = %v, errors.Is(DeadlineExceeded) = %v", k, Of(err), Is(k, err), errors.Is(err, context.DeadlineExceeded))
		}
		text, wire := Reply(err)
		back := FromReply(text, wire)
		if Of(back) != k || back.Error() != err.Error() {
			t.Errorf("%v over the wire came back as %v %q", k, Of(back), back)
		}
	}
}

func TestUnclassifiedAndOlderSenders(t *testing.T) {
	if Of(errors.New("x")) != Other || Of(nil) != Other || Is(Other, nil) || E(Invalid, nil) != nil {
		t.Fatal("nil and unkinded errors")
	}
	// An unclassified error is the service's own fault.
	if _, k := Reply(errors.New("x")); k != gauntletv1.ErrorKind_ERROR_KIND_INTERNAL {
		t.Errorf("unkinded error travels as %v", k)
	}
	// A reply without a kind comes from a sender whose errors were final.
	if k := Of(FromReply("bad mix", gauntletv1.ErrorKind_ERROR_KIND_UNSPECIFIED)); k != Invalid {
		t.Errorf("kindless reply read as %v", k)
	}
	if FromReply("", gauntletv1.ErrorKind_ERROR_KIND_UNAVAILABLE) != nil {
		t.Error("a reply without text is no error")
	}
	// The outermost kind decides: a caller may reclassify.
	if k := Of(E(Invalid, fmt.Errorf("wrapped: %w", E(Unavailable, errors.New("x"))))); k != Invalid {
		t.Errorf("outer kind lost: %v", k)
	}
}

func TestInfraMarkSurvivesWrapping(t *testing.T) {
	base := errors.New("endpoint answered 503")
	err := fmt.Errorf("policy http at step 3: %w", Infra(gauntletv1.InfraKind_INFRA_KIND_MODEL_ENDPOINT, E(Unavailable, base)))
	if got := InfraOf(err); got != gauntletv1.InfraKind_INFRA_KIND_MODEL_ENDPOINT {
		t.Errorf("InfraOf = %v, want model endpoint", got)
	}
	if !Is(Unavailable, err) || !errors.Is(err, base) || err.Error() != "policy http at step 3: endpoint answered 503" {
		t.Errorf("the mark changed the error: kind %v, %q", Of(err), err)
	}
	if InfraOf(base) != gauntletv1.InfraKind_INFRA_KIND_UNSPECIFIED || InfraOf(nil) != gauntletv1.InfraKind_INFRA_KIND_UNSPECIFIED || Infra(gauntletv1.InfraKind_INFRA_KIND_SANDBOX, nil) != nil {
		t.Error("unmarked and nil errors")
	}
}
