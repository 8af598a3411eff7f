package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCurriculumValidateRefusesWhatStartRefuses: a spec too large to start is refused by
// validate too, with the same short message, and start refuses it before dialling
// Temporal (nothing listens at the address given).
func TestCurriculumValidateRefusesWhatStartRefuses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big.yaml")
	big := "stages:\n  - {env: shop, policies: \"oracle=1," + strings.Repeat("x", 10<<20) +
		"\", episodes: {max: 10}, promotion: {metric: success_rate, threshold: 1, window: 10}}\n"
	if err := os.WriteFile(path, []byte(big), 0o644); err != nil {
		t.Fatal(err)
	}
	var msgs []string
	for _, sub := range []string{"validate", "start"} {
		var out, errb bytes.Buffer
		err := runMain(context.Background(), []string{"curriculum", sub, "-f", path, "--temporal", "127.0.0.1:1"}, &out, &errb)
		if err == nil {
			t.Fatalf("curriculum %s accepted a 10 MB spec: %s", sub, out.String())
		}
		msg := err.Error() + errb.String() + out.String()
		if len(msg) > 500 || !strings.Contains(msg, "larger than the 1024 KiB limit") {
			t.Fatalf("curriculum %s: %d bytes of error %.300q; want a short size refusal", sub, len(msg), msg)
		}
		msgs = append(msgs, err.Error())
	}
	if msgs[0] != msgs[1] {
		t.Errorf("validate says %q, start says %q", msgs[0], msgs[1])
	}
}
