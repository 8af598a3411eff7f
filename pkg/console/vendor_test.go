package console

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path"
	"regexp"
	"testing"
)

// TestVendoredBundleMatchesPin checks that the embedded front-end library is exactly what
// scripts/vendor-console.sh pins: its version and integrity in VERSION, and every file's
// sha256. A hand edit of a vendored file, or a pin changed without running the script,
// fails here.
func TestVendoredBundleMatchesPin(t *testing.T) {
	script, err := os.ReadFile("../../scripts/vendor-console.sh")
	if err != nil {
		t.Fatal(err)
	}
	s := string(script)
	version := regexp.MustCompile(`(?m)^UPLOT_VERSION=(\S+)$`).FindStringSubmatch(s)
	integrity := regexp.MustCompile(`(?m)^UPLOT_INTEGRITY=(\S+)$`).FindStringSubmatch(s)
	if version == nil || integrity == nil {
		t.Fatal("scripts/vendor-console.sh: no UPLOT_VERSION or UPLOT_INTEGRITY line")
	}
	got, err := staticFiles.ReadFile("static/vendor/VERSION")
	if err != nil {
		t.Fatal(err)
	}
	if want := "uplot " + version[1] + " " + integrity[1] + "\n"; string(got) != want {
		t.Errorf("static/vendor/VERSION = %q, the script pins %q: run scripts/vendor-console.sh", got, want)
	}
	pins := regexp.MustCompile(`(?m)^\s*\[(\S+)\]=([0-9a-f]{64})$`).FindAllStringSubmatch(s, -1)
	if len(pins) == 0 {
		t.Fatal("scripts/vendor-console.sh: no sha256 pins")
	}
	for _, p := range pins {
		name := path.Base(p[1])
		if p[1] == "LICENSE" {
			name = "uPlot.LICENSE"
		}
		b, err := staticFiles.ReadFile("static/vendor/" + name)
		if err != nil {
			t.Errorf("pinned %s: %v", p[1], err)
			continue
		}
		sum := sha256.Sum256(b)
		if h := hex.EncodeToString(sum[:]); h != p[2] {
			t.Errorf("static/vendor/%s has sha256 %s, the script pins %s: run scripts/vendor-console.sh", name, h, p[2])
		}
	}
	// Nothing but what the script writes is in the vendor directory.
	entries, err := staticFiles.ReadDir("static/vendor")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		known := e.Name() == "VERSION"
		for _, p := range pins {
			if name := path.Base(p[1]); name == e.Name() || (p[1] == "LICENSE" && e.Name() == "uPlot.LICENSE") {
				known = true
			}
		}
		if !known {
			t.Errorf("static/vendor/%s is not written by scripts/vendor-console.sh", e.Name())
		}
	}
}
