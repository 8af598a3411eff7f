package main

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The stack runs on the NATS server deploy/ ships, not only on the embedded one this
// module builds in (a newer version): the version deploy/compose/compose.yaml names is
// installed by scripts/deps.sh as nats-server, started here with deploy/compose/nats.conf
// (its paths and ports moved into the test's directory), and a run over it is recorded
// exactly. A deploy that moves to another NATS without deps.sh following fails here.
func TestStackOnTheDeployedNATS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nats-server, ClickHouse and a stack; -short runs unit tests only")
	}
	compose, err := os.ReadFile(filepath.Join("..", "..", "deploy", "compose", "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`image: nats:(\d+\.\d+)`).FindSubmatch(compose)
	if m == nil {
		t.Fatal("deploy/compose/compose.yaml names no nats:<major>.<minor> image")
	}
	deployed := string(m[1])
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		t.Fatalf("nats-server %s (the version deploy/ ships) is not installed: run scripts/deps.sh", deployed)
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v: %s", bin, err, out)
	}
	if !strings.Contains(string(out), "v"+deployed+".") {
		t.Fatalf("%s is %s; deploy/ ships NATS %s: run scripts/deps.sh (and keep its pin in step with deploy/)", bin, strings.TrimSpace(string(out)), deployed)
	}

	conf, err := os.ReadFile(filepath.Join("..", "..", "deploy", "compose", "nats.conf"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	port, httpPort := freePort(t), freePort(t)
	c := string(conf)
	for _, r := range []struct{ pattern, with string }{
		{`(?m)^port: \d+$`, fmt.Sprintf("host: 127.0.0.1\nport: %d", port)},
		{`(?m)^http_port: \d+$`, fmt.Sprintf("http: 127.0.0.1:%d", httpPort)},
		{`(?m)^(\s*)store_dir: \S+$`, "${1}store_dir: " + filepath.Join(dir, "js")},
	} {
		re := regexp.MustCompile(r.pattern)
		if !re.MatchString(c) {
			t.Fatalf("deploy/compose/nats.conf has no line matching %s", r.pattern)
		}
		c = re.ReplaceAllString(c, r.with)
	}
	confPath := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(confPath, []byte(c), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := startProc(t, bin, "-js", "--config", confPath)
	t.Cleanup(func() {
		_ = srv.Process.Kill()
		_ = srv.Wait()
	})
	healthy := func() bool {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz?js-enabled-only=true", httpPort))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	deadline := time.Now().Add(time.Minute)
	for !healthy() {
		if time.Now().After(deadline) {
			t.Fatalf("nats-server %s not healthy after a minute", deployed)
		}
		time.Sleep(100 * time.Millisecond)
	}

	cfg := testConfig(t)
	cfg.NATSURL = fmt.Sprintf("nats://127.0.0.1:%d", port)
	s := startStack(t, cfg)
	b := s.app.getBus()
	if v := b.NC.ConnectedServerVersion(); !strings.HasPrefix(v, deployed+".") {
		t.Fatalf("the stack is connected to NATS %s, want %s", v, deployed)
	}
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)
	req := newRun(t, 500, "oracle=1,random=1", 17)
	final := runToEnd(t, b, conn, cfg.Database, req)
	assertExact(t, b, conn, cfg.Database, req, final)
}
