package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gauntlet-rl/gauntlet/pkg/threats"
)

// cmdRewardFingerprints is `gauntlet reward fingerprints [--json] [--forget ID]`: the
// threat fingerprints every player flags (docs/rewards.md), and forgetting one.
func cmdRewardFingerprints(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("reward fingerprints", stderr)
	var sf stackFlags
	sf.register(fs, partNATS)
	asJSON := fs.Bool("json", false, "one JSON object per fingerprint, a line each")
	forget := fs.String("forget", "", "remove the fingerprint with this id: every player stops flagging it")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gauntlet reward fingerprints: unexpected argument %q\n", fs.Arg(0))
		return errUsage
	}
	b, err := sf.connectBus("gauntlet-reward", stderr)
	if err != nil {
		return err
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return rewardFingerprints(ctx, b.JS, *forget, *asJSON, stdout)
}

// rewardFingerprints lists the bucket's fingerprints, or forgets one.
func rewardFingerprints(ctx context.Context, js jetstream.JetStream, forget string, asJSON bool, w io.Writer) error {
	if forget != "" {
		if err := threats.Forget(ctx, js, forget); err != nil {
			return err
		}
		fmt.Fprintf(w, "threat fingerprint %s forgotten: players stop flagging it\n", forget)
		return nil
	}
	list, err := threats.List(ctx, js)
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(w)
		for _, f := range list {
			if err := enc.Encode(f); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTOOL\tCOMMAND\tWHAT THE SANDBOX SAW\tFIRST SEEN")
	for _, f := range list {
		var seen []string
		for _, e := range f.Events {
			seen = append(seen, strings.TrimSpace(strings.Join([]string{e.Kind, e.Syscall, e.Path}, " ")))
		}
		at := "-"
		if f.RecordedAtUnixNano > 0 {
			at = time.Unix(0, f.RecordedAtUnixNano).UTC().Format(time.DateTime)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s, %s step %d\n", f.ID, f.Tool, shorten(f.Command, 60),
			strings.Join(seen, "; "), at, f.Episode, f.Step)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "(%d fingerprints)\n", len(list))
	return nil
}

// shorten cuts s to n runes, marking the cut.
func shorten(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
