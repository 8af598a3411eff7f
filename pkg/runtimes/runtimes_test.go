package runtimes_test

import (
	"context"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
)

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		c    runtimes.Config
		want string // "" for valid
	}{
		{runtimes.Config{}, ""},
		{runtimes.Config{Runtime: runtimes.Process, StateDir: "/x"}, ""},
		{runtimes.Config{Runtime: runtimes.Containerd, StateDir: "/x"}, ""},
		{runtimes.Config{Runtime: "docker", StateDir: "/x"}, `sandbox.runtime: "docker" is not one of`},
		{runtimes.Config{Runtime: runtimes.Process}, "sandbox.state-dir: must be set"},
	}
	for _, tc := range cases {
		err := tc.c.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.c, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: error %v, want %q", tc.c, err, tc.want)
		}
	}
	if sb, err := runtimes.Open(context.Background(), runtimes.Config{}, nil); sb != nil || err != nil {
		t.Errorf("Open with no runtime = %v, %v; want nil, nil", sb, err)
	}
}
