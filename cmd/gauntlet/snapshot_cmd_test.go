package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// Bad snapshot and fork command lines are refused before anything starts.
func TestBadSnapshotCommandLines(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"episode", "snapshot", "ep-1"}, "usage: gauntlet episode snapshot"},
		{[]string{"episode", "snapshot", "--step", "2"}, "usage: gauntlet episode snapshot"},
		{[]string{"episode", "snapshot", "a", "b", "--step", "1"}, "usage: gauntlet episode snapshot"},
		{[]string{"episode", "snapshot", "x'; DROP", "--step", "1"}, "only letters, digits"},
		{[]string{"episode", "snapshot", "ep-1", "--step", "x"}, `invalid value "x" for flag -step`},
		{[]string{"episode", "fork", "ep-1", "--step", "1", "--branches", "0"}, "--branches: 0 must be between 1 and 64"},
		{[]string{"episode", "fork", "ep-1", "--step", "1", "--policy", "genius"}, `unknown policy "genius"`},
		{[]string{"episode", "fork", "ep-1", "--step", "1", "--data-dir", "/nonexistent"}, "no running stack found"},
		{[]string{"episode", "show"}, "usage: gauntlet episode show"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := runMain(context.Background(), tc.args, &out, &errOut)
			if err == nil {
				t.Fatalf("accepted; stdout %q", out.String())
			}
			if msg := err.Error() + "\n" + errOut.String(); !strings.Contains(msg, tc.want) {
				t.Fatalf("error %q does not say %q", msg, tc.want)
			}
		})
	}
}
