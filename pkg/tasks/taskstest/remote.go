package taskstest

import (
	"io"
	"net/http"
)

// ReleasesHost is the host datasets/gauntlet/net/latest-release allows (its task.toml's
// allowed_hosts). There is no internet where gauntlet's tests run, so a test that plays
// that task serves ReleasesHandler on the host's loopback and maps the name to it
// (--sandbox.hosts releases.example.test=ADDR); the sandbox reaches it only by name,
// through gauntlet's proxy.
const ReleasesHost = "releases.example.test"

// ReleasesIndex is what ReleasesHost publishes at /v1/widget/releases.json: the releases
// of a tool, in no particular order. The task's tests expect the newest stable one,
// 2.10.1 (2.11.0-rc.1 is a pre-release; a string sort would pick 2.9.3), and its digest.
const ReleasesIndex = `{
  "name": "widget",
  "releases": [
    {"version": "2.9.3", "prerelease": false, "sha256": "3b1e6c0f4f2a9d8e7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d"},
    {"version": "2.11.0-rc.1", "prerelease": true, "sha256": "9f8e7d6c5b4a39281706f5e4d3c2b1a0f9e8d7c6b5a4938271605f4e3d2c1b0a"},
    {"version": "2.10.1", "prerelease": false, "sha256": "c0ffee00d15ea5e5ba5eba11facade0ddba11cafe0b0e5c0de5eed5ca1ab1e5"},
    {"version": "2.10.0", "prerelease": false, "sha256": "0d1e2f3a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9001a2b3c4d5e6"},
    {"version": "1.12.4", "prerelease": false, "sha256": "aa55aa55aa55aa55aa55aa55aa55aa55aa55aa55aa55aa55aa55aa55aa55aa55"}
  ]
}
`

// ReleasesHandler serves ReleasesIndex at /v1/widget/releases.json and 404 elsewhere.
func ReleasesHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/widget/releases.json" || (r.Method != http.MethodGet && r.Method != http.MethodHead) {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, ReleasesIndex)
	})
}
