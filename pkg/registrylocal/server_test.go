package registrylocal_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/registrylocal"
	"github.com/gauntlet-rl/gauntlet/pkg/registrylocal/registrytest"
)

// pushBlob uploads data as a blob of repo with the registry API's monolithic upload
// (POST to open an upload, PUT with the digest to close it) and returns its digest.
func pushBlob(t *testing.T, addr, repo string, data []byte) string {
	t.Helper()
	sum := sha256.Sum256(data)
	dgst := "sha256:" + hex.EncodeToString(sum[:])
	resp, err := http.Post("http://"+addr+"/v2/"+repo+"/blobs/uploads/", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("open upload: %s", resp.Status)
	}
	loc := resp.Header.Get("Location")
	sep := "?"
	if strings.Contains(loc, "?") {
		sep = "&"
	}
	if strings.HasPrefix(loc, "/") {
		loc = "http://" + addr + loc
	}
	req, err := http.NewRequest(http.MethodPut, loc+sep+"digest="+dgst, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("close upload: %s", resp.Status)
	}
	return dgst
}

func blobStatus(t *testing.T, addr, repo, dgst string) int {
	t.Helper()
	resp, err := http.Head("http://" + addr + "/v2/" + repo + "/blobs/" + dgst)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestStoresBlobsAcrossRestarts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local server; -short runs unit tests only")
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := registrylocal.Start(ctx, registrylocal.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	addr := srv.Addr()
	dgst := pushBlob(t, addr, "gauntlet/test", []byte("a layer"))
	if got := blobStatus(t, addr, "gauntlet/test", dgst); got != http.StatusOK {
		t.Fatalf("HEAD the pushed blob: %d", got)
	}
	if got := blobStatus(t, addr, "gauntlet/test", "sha256:"+strings.Repeat("0", 64)); got != http.StatusNotFound {
		t.Fatalf("HEAD a blob never pushed: %d, want 404", got)
	}
	// A crash leaves the storage; a new registry on the same Dir serves the blob.
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	port, err := strconvPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	srv, err = registrylocal.Start(ctx, registrylocal.Options{Dir: dir, Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop(context.Background())
	if srv.Addr() != addr {
		t.Fatalf("restarted on %s, asked for %s", srv.Addr(), addr)
	}
	if got := blobStatus(t, addr, "gauntlet/test", dgst); got != http.StatusOK {
		t.Fatalf("HEAD the pushed blob after a restart: %d", got)
	}
}

func strconvPort(addr string) (int, error) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(p)
}

func TestStartFailsOnATakenPortQuotingTheLog(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local server; -short runs unit tests only")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := registrylocal.Start(ctx, registrylocal.Options{Dir: t.TempDir(), Port: port})
	if err == nil {
		srv.Stop(ctx)
		t.Fatal("started on a taken port")
	}
	if !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("error does not say why: %v", err)
	}
}

// TestStartOnThePortOfAnotherRegistry: tests of several packages start registries at
// once, and a port picked free can be bound by another's first. The second server then
// exits, and its start must not take the first one's answer for its own readiness.
func TestStartOnThePortOfAnotherRegistry(t *testing.T) {
	if testing.Short() {
		t.Skip("starts local servers; -short runs unit tests only")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	other, err := registrylocal.Start(ctx, registrylocal.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Stop(ctx)
	_, portText, _ := net.SplitHostPort(other.Addr())
	port, _ := strconv.Atoi(portText)
	srv, err := registrylocal.Start(ctx, registrylocal.Options{Dir: t.TempDir(), Port: port})
	if err == nil {
		srv.Stop(ctx)
		t.Fatalf("Start on the port of another running registry (%s) reported ready", other.Addr())
	}
	if !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("error does not say why: %v", err)
	}
}

func TestStartWithoutTheBinary(t *testing.T) {
	_, err := registrylocal.Start(context.Background(), registrylocal.Options{
		Dir: t.TempDir(), Binary: filepath.Join(t.TempDir(), "no-such-registry"),
	})
	if !errors.Is(err, registrylocal.ErrNotInstalled) {
		t.Fatalf("err = %v, want ErrNotInstalled", err)
	}
}

func TestRegistrytestServesTheAPI(t *testing.T) {
	srv := registrytest.Start(t)
	resp, err := http.Get("http://" + srv.Addr() + "/v2/_catalog")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(buf.String(), `"repositories"`) {
		t.Fatalf("GET /v2/_catalog: %s %s", resp.Status, buf.String())
	}
}

func TestStartWithAuthRefusesAnonymousClients(t *testing.T) {
	srv := registrytest.StartWithAuth(t, "alice", "s3cret")
	get := func(user, password string) int {
		req, err := http.NewRequest(http.MethodGet, "http://"+srv.Addr()+"/v2/", nil)
		if err != nil {
			t.Fatal(err)
		}
		if user != "" {
			req.SetBasicAuth(user, password)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get("", ""); got != http.StatusUnauthorized {
		t.Errorf("anonymous: %d, want 401", got)
	}
	if got := get("alice", "wrong"); got != http.StatusUnauthorized {
		t.Errorf("a wrong password: %d, want 401", got)
	}
	if got := get("alice", "s3cret"); got != http.StatusOK {
		t.Errorf("alice: %d, want 200", got)
	}
}
