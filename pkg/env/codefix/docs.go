package codefix

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// The docs service (param docs=1): an HTTP service the env runs on the host's loopback,
// which the sandbox reaches as http://docs:8080 ($DOCS_URL) through the fault gateway the
// episode's boundary layer opens for the sandbox's services (package boundary, over
// svcnet). The episode's fault plan has rules for it like for any service (baseline
// latency on every call, rare 429/503/truncation, more under stress and edge); the faults
// that fire on the agent's requests are recorded on the step. The sandbox resolves "docs"
// through the gateway's name server, where the plan's DNS faults (from its boundary_spec)
// apply.
const (
	// DocsService is the service's name inside the sandbox and its fault target.
	DocsService = "docs"
	// DocsPort is its port inside the sandbox.
	DocsPort = 8080
	// DocsTemplate is the sandbox template of episodes with the docs service.
	DocsTemplate = "codefix-sh-docs"
	// DocsCommand is what the oracle runs to read the docs.
	DocsCommand = `busybox wget -q -O- "$DOCS_URL/guide"`
)

// docsGuide is what GET /guide answers.
const docsGuide = `codefix guide
Each function of src/lib.sh is described in README.md; tests/test_lib.sh checks it.
Run the tests with: sh tests/test_lib.sh
Fix the function, never the tests: the verifier compares tests/ byte for byte.
`

var docsHost struct {
	once sync.Once
	addr string
	err  error
}

// docsUpstream starts the process's docs server on the host's loopback (once) and
// returns its address.
func docsUpstream() (string, error) {
	docsHost.once.Do(func() {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			docsHost.err = fmt.Errorf("codefix: docs service: %w", err)
			return
		}
		mux := http.NewServeMux()
		mux.HandleFunc("GET /guide", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = io.WriteString(w, docsGuide)
		})
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(l) }() // lives as long as the process
		docsHost.addr = l.Addr().String()
	})
	return docsHost.addr, docsHost.err
}

// docsServices are the services of an episode's sandbox.
func docsServices(p params) ([]sandbox.Service, error) {
	if !p.docs {
		return nil, nil
	}
	up, err := docsUpstream()
	if err != nil {
		return nil, err
	}
	return []sandbox.Service{{Name: DocsService, Port: DocsPort, Upstream: up}}, nil
}
