package svcnet_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/netns"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/process"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/svcnet"
)

// The hosts of the TLS tests: each meets one kind of fault on its streams (the clean one
// none), all served by one TLS server whose certificate names them all.
const (
	slowHost  = "slow.example.test"
	cutHost   = "cut.example.test"
	rstHost   = "rst.example.test"
	thinHost  = "thin.example.test"
	flakyHost = "flaky.example.test"
	// altPort is a port other than 443 the runtime maps for remoteHost.
	altPort = 8443
)

var tlsHosts = []string{remoteHost, slowHost, cutHost, rstHost, thinHost, flakyHost}

// tlsProfile: the faults a relay can apply to a stream it cannot open, one host each,
// decided once per connection; flaky's half of the time, so seeds show. The HTTP-level
// rule cannot act on a stream the gateway does not open.
const tlsProfile = `
name: egress-tls-test
faults:
  - id: tls-slow
    kind: latency
    match: {hosts: [slow.example.test]}
    params: {mean_ms: 400, jitter_ms: 0}
  - id: tls-cut
    kind: reset
    match: {hosts: [cut.example.test]}
    params: {after_bytes: 100}
  - id: tls-rst
    kind: reset
    match: {hosts: [rst.example.test]}
    params: {after_bytes: 0}
  - id: tls-thin
    kind: bandwidth
    match: {hosts: [thin.example.test]}
    params: {bytes_per_sec: 20000}
  - id: tls-flaky
    kind: reset
    probability: 0.5
    match: {hosts: [flaky.example.test]}
    params: {after_bytes: 0}
  - id: http-503
    kind: http_error
    match: {hosts: ["*.example.test"]}
    params: {status: 503}
`

// tlsRemote starts the "remote" HTTPS server (Go's httptest TLS server) on the host's
// loopback with a self-signed certificate naming every host of tlsHosts; every path
// answers bodyLen bytes. It returns the server's address and the certificate in PEM,
// which clients in the sandbox trust.
func tlsRemote(t testing.TB) (addr, certPEM string) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: remoteHost},
		DNSNames:              tlsHosts,
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	body := strings.Repeat("0123456789", bodyLen/10)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, body) }))
	srv.TLS = &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		// curl and python speak TLS 1.3; busybox's wget (the containerd base image's
		// only client) speaks TLS 1.2 without signature_algorithms there, which Go
		// refuses for the suites that sign: offer it RSA key exchange.
		CipherSuites: []uint16{tls.TLS_RSA_WITH_AES_128_GCM_SHA256, tls.TLS_RSA_WITH_AES_128_CBC_SHA, tls.TLS_RSA_WITH_AES_256_CBC_SHA},
	}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the resets the tests inject
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String(), string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// tlsHostMap maps port 443 of every TLS host, and altPort of remoteHost, to the TLS
// server at addr, and remoteHost's plain HTTP to httpAddr.
func tlsHostMap(httpAddr, addr string) sandbox.HostMap {
	m := sandbox.HostMap{remoteHost: httpAddr, remoteHost + ":" + strconv.Itoa(altPort): addr}
	for _, h := range tlsHosts {
		m[h+":443"] = addr
	}
	return m
}

// tlsClient is how a test fetches https://HOST[:PORT]/PATH in a sandbox: curl or
// python3 (the host's, on the process runtime) checking the certificate against
// ca.pem, or busybox's wget, which checks none (the containerd base image has nothing
// else).
type tlsClient func(url string) string

func curlClient(url string) string {
	return `curl -sS --max-time 20 --cacert ca.pem -o body ` + url + `; echo rc=$?; wc -c < body; rm -f body`
}

func pythonClient(url string) string {
	return `python3 -c 'import ssl,sys,urllib.request
try:
    b=urllib.request.urlopen(sys.argv[1], context=ssl.create_default_context(cafile="ca.pem"), timeout=20).read()
    print("rc=0"); print(len(b))
except Exception as e:
    print("rc=1", e)' ` + url
}

// busybox's wget segfaults on https:// with -T here: no timeout.
func wgetClient(url string) string {
	return `busybox wget -q --no-check-certificate -O body ` + url + `; echo rc=$?; wc -c < body; rm -f body`
}

// runEgressTLS is the proof on one runtime that a sandbox reaches its allowed hosts over
// HTTPS, on 443 and on another port the runtime maps, by name, through the gateway's
// relay, which checks the ClientHello's server name against the allow-list; that the
// faults a relay can apply to an opaque stream (latency, reset, a cut after N bytes,
// bandwidth) fire there, are recorded with the connection, and replay the same under
// the same seed; and that other hosts are refused and recorded.
func runEgressTLS(t *testing.T, rt sandbox.Runtime, image, certPEM string, clients map[string]tlsClient) {
	r := newEgressRig(t, rt, image, sandbox.Service{Hosts: tlsHosts, TLSPorts: []int{443, altPort}})
	rules := rulesOf(t, tlsProfile)
	r.attach(inject.NewDecider(1, rules))
	rec := r.rec
	sh := func(cmd string) (string, time.Duration) {
		t.Helper()
		res, took := r.sh(cmd)
		return res.Stdout + res.Stderr, took
	}
	sh("cat > ca.pem <<'EOF'\n" + certPEM + "EOF")
	served := "rc=0\n" + strconv.Itoa(bodyLen) + "\n"

	// The allowed host answers over HTTPS by name, on 443 and on the mapped port, its
	// own certificate checked by the client: the gateway relays TLS, unopened. Each
	// connection is recorded with its host, port and bytes each way; the HTTP-level
	// rule (503 for every host) cannot meet a stream it cannot read.
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range clients {
			if !yield(n) {
				return
			}
		}
	})
	for _, name := range names {
		for _, url := range []string{"https://" + remoteHost + "/ok", fmt.Sprintf("https://%s:%d/ok", remoteHost, altPort)} {
			if out, _ := sh(clients[name](url)); !strings.HasPrefix(out, served) {
				t.Errorf("%s %s: got %q, want the body", name, url, out)
			}
		}
		got := r.requests(2)
		if len(got) != 2 {
			t.Fatalf("%s: recorded %+v, want two connections", name, got)
		}
		for i, port := range []int{443, altPort} {
			r := got[i]
			if r.Host != remoteHost || r.Port != port || r.Method != svcnet.MethodTLS || r.Denied || r.Error != "" || len(r.Faults) != 0 || r.Bytes <= bodyLen || r.BytesUp < 100 {
				t.Errorf("%s: recorded %+v, want a clean connection to %s:%d with the body's bytes", name, r, remoteHost, port)
			}
		}
	}
	if f := rec.Take(); len(f) != 0 {
		t.Errorf("clean connections met faults: %v", f)
	}

	// Other hosts over TLS are refused, with an access_denied alert where the client
	// named one: a name not allowed (it resolves nowhere, so curl is pointed at the
	// gateway by hand) and an address (no server name). busybox's wget can do the
	// second alone.
	client := clients[names[0]]
	cmd := `busybox wget -q --no-check-certificate -O- https://127.0.0.1/x; echo rc=$?`
	if _, ok := clients["curl"]; ok {
		client = clients["curl"]
		cmd = `curl -sS --max-time 20 --resolve other.example.test:443:127.0.0.1 --cacert ca.pem https://other.example.test/x; echo rc=$?
curl -sS --max-time 20 -k https://127.0.0.1/x; echo rc=$?`
	}
	out, _ := sh(cmd)
	if strings.Contains(out, "rc=0") || strings.Contains(out, "0123456789") {
		t.Errorf("denied: a body was served: %q", out)
	}
	got := rec.TakeRequests()
	if _, ok := clients["curl"]; ok {
		if !strings.Contains(out, "access denied") {
			t.Errorf("denied: curl said %q, want the access_denied alert", out)
		}
		if len(got) != 2 || got[0].Host != "other.example.test" || got[0].Error != "host not allowed in this sandbox" {
			t.Fatalf("denied: recorded %+v, want other.example.test refused, then the address", got)
		}
		got = got[1:]
	}
	if len(got) != 1 || !got[0].Denied || got[0].Bytes != 0 || got[0].Port != 443 ||
		!(got[0].Host == "" && got[0].Error == "no server name (SNI) in the TLS ClientHello" || got[0].Host == "127.0.0.1" && got[0].Error == "host not allowed in this sandbox") {
		t.Errorf("denied: recorded %+v, want the connection to the address refused", got)
	}

	// The stream faults, seeded: run every host a few times, then again on a new
	// gateway with the same seed: the same connections meet the same faults.
	play := func() ([]svcnet.Request, map[string]time.Duration, string) {
		took := map[string]time.Duration{}
		var outs strings.Builder
		for _, host := range []string{slowHost, cutHost, rstHost, thinHost, flakyHost, flakyHost, flakyHost, flakyHost, flakyHost, flakyHost} {
			out, d := sh(client("https://" + host + "/ok"))
			took[host] = max(took[host], d)
			fmt.Fprintf(&outs, "%s: %s\n", host, strings.SplitN(out, "\n", 2)[0])
		}
		return r.requests(10), took, outs.String()
	}
	first, took, outs := play()
	if len(first) != 10 {
		t.Fatalf("faults: recorded %+v, want ten connections", first)
	}
	faults := map[string][]string{}
	for _, r := range first {
		if r.Port != 443 || r.Method != svcnet.MethodTLS || r.Denied || r.Error != "" {
			t.Errorf("faults: recorded %+v, want relayed connections on 443", r)
		}
		faults[r.Host] = append(faults[r.Host], strings.Join(r.Faults, "+"))
	}
	if fs := faults[slowHost]; !slices.Equal(fs, []string{"latency"}) || took[slowHost] < 400*time.Millisecond {
		t.Errorf("latency: faults %v in %v, want latency of at least 400ms", fs, took[slowHost])
	}
	if fs := faults[thinHost]; !slices.Equal(fs, []string{"bandwidth"}) || !strings.Contains(outs, thinHost+": rc=0") {
		t.Errorf("bandwidth: faults %v, want the body served slowly: %s", fs, outs)
	}
	for _, host := range []string{cutHost, rstHost} {
		if fs := faults[host]; !slices.Equal(fs, []string{"reset"}) || strings.Contains(outs, host+": rc=0") {
			t.Errorf("%s: faults %v, want one reset failing the fetch: %s", host, fs, outs)
		}
	}
	for _, r := range first {
		switch r.Host {
		case cutHost:
			if r.Bytes != 100 {
				t.Errorf("cut: %d bytes reached the sandbox, want 100", r.Bytes)
			}
		case rstHost:
			if r.Bytes != 0 {
				t.Errorf("reset: %d bytes reached the sandbox, want none", r.Bytes)
			}
		}
	}
	if fs := faults[flakyHost]; !slices.Contains(fs, "reset") || !slices.Contains(fs, "") {
		t.Errorf("flaky: %v, want some connections reset and some not under seed 1", fs)
	}
	firstFaults := rec.Take()
	for _, f := range firstFaults {
		if f.Target == "egress" || !strings.Contains(f.Detail, " on tls/"+f.Target+":443/") {
			t.Errorf("fault recorded as %v, want it on the host's connection", f)
		}
	}
	r.attach(inject.NewDecider(1, rules))
	again, _, _ := play()
	// The bytes of a reset connection are the fault's; those of one the client closed
	// may or may not count the host's answer to the close (a TLS alert), which races
	// with it.
	same := func(a, b svcnet.Request) bool {
		return a.Host == b.Host && a.Port == b.Port && slices.Equal(a.Faults, b.Faults) && a.Denied == b.Denied && a.Error == b.Error &&
			(!slices.Contains(a.Faults, "reset") || a.Bytes == b.Bytes && a.BytesUp == b.BytesUp)
	}
	if !slices.EqualFunc(first, again, same) {
		t.Errorf("replay: recorded %+v, want %+v", again, first)
	}
	key := func(f interface {
		GetFaultId() string
		GetTarget() string
		GetDetail() string
	}) string {
		return f.GetFaultId() + " " + f.GetTarget() + " " + f.GetDetail()
	}
	var a, b []string
	for _, f := range firstFaults {
		a = append(a, key(f))
	}
	for _, f := range rec.Take() {
		b = append(b, key(f))
	}
	if !slices.Equal(a, b) {
		t.Errorf("replay: faults %v, want %v", b, a)
	}
}

// TestTLSCloseRecordsNothing: a connection to a TLS port that has sent nothing yet when
// the gateway closes is no denial: the sandbox did nothing wrong, and nothing is recorded.
func TestTLSCloseRecordsNothing(t *testing.T) {
	dir := t.TempDir()
	rt, err := process.New(process.Config{StateDir: dir})
	if err != nil {
		t.Fatalf("process runtime unavailable: %v", err)
	}
	t.Cleanup(func() { _ = rt.Purge(context.Background()); _ = rt.Close() })
	ctx := context.Background()
	h, err := rt.Create(ctx, sandbox.Spec{Services: []sandbox.Service{{Name: "egress", Port: 80, Protocol: sandbox.ProtocolEgress, Hosts: []string{remoteHost}, TLSPorts: []int{443}}}})
	if err != nil {
		t.Fatal(err)
	}
	rec := &svcnet.Recorder{}
	g, err := svcnet.Attach(ctx, rt, h.ID, h.Spec.Services, svcnet.Options{OnRequest: rec.OnRequest})
	if err != nil {
		t.Fatal(err)
	}
	c, err := netns.Dial(ctx, filepath.Join(dir, "netns", h.ID), "tcp", "127.0.0.1:443")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(100 * time.Millisecond) // the gateway is reading the ClientHello
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if got := rec.TakeRequests(); len(got) != 0 {
		t.Errorf("recorded %+v at close, want nothing", got)
	}
}
