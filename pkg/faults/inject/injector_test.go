package inject_test

import (
	"math"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/faulttest"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// call is one simulated service call of a scripted episode.
type call struct{ service, tool string }

// script is a fixed call sequence over shop's services: n calls, cycling services and tools.
func script(n int) []call {
	tools := []string{"get", "list", "update"}
	out := make([]call, n)
	for i := range out {
		s := shopServices[i%len(shopServices)]
		out[i] = call{s, s + "." + tools[(i/len(shopServices))%len(tools)]}
	}
	return out
}

// run plays calls through in, one virtual millisecond apart.
func run(in *inject.Injector, calls []call) []inject.Outcome {
	out := make([]inject.Outcome, len(calls))
	for i, c := range calls {
		out[i] = in.Call(c.service, c.tool, time.Duration(i)*time.Millisecond)
	}
	return out
}

func equalOutcomes(a, b inject.Outcome) bool {
	return a.Status == b.Status && a.RetryAfter == b.RetryAfter && a.Latency == b.Latency &&
		a.Keep == b.Keep && slices.EqualFunc(a.Fired, b.Fired, func(x, y *gauntletv1.FaultFired) bool { return proto.Equal(x, y) })
}

func TestInjectorIsDeterministic(t *testing.T) {
	calls := script(5000)
	for _, profile := range plans.Profiles() {
		t.Run(profile, func(t *testing.T) {
			for seed := uint64(0); seed < 20; seed++ {
				plan := mustPlan(t, seed, profile, shopServices)
				a, err := inject.NewInjector(plan)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := inject.NewInjector(proto.Clone(plan).(*gauntletv1.FaultPlan))
				outA, outB := run(a, calls), run(b, calls)
				fired := 0
				for i := range calls {
					if !equalOutcomes(outA[i], outB[i]) {
						t.Fatalf("seed %d call %d: outcomes differ: %+v vs %+v", seed, i, outA[i], outB[i])
					}
					fired += len(outA[i].Fired)
				}
				if fired == 0 {
					t.Fatalf("seed %d: nothing fired in %d calls", seed, len(calls))
				}
			}
		})
	}
}

// firedBy reports, per outcome, whether the rule id fired.
func firedBy(outs []inject.Outcome, id string) []bool {
	got := make([]bool, len(outs))
	for i, o := range outs {
		got[i] = slices.ContainsFunc(o.Fired, func(f *gauntletv1.FaultFired) bool { return f.FaultId == id })
	}
	return got
}

// Adding rules never shifts another rule's stream: an unrelated rule leaves its firing
// sequence untouched, and an abort that shadows it hides exactly the calls it fires on.
func TestInjectorRuleStreamsAreIndependent(t *testing.T) {
	calls := script(20000)
	target := faulttest.HTTPError("payment.http_503", "payment", 0.3, 503, 200)
	alone := run(faulttest.Injector(t, 9, target), calls)
	want := firedBy(alone, target.Id)

	t.Run("unrelated rules", func(t *testing.T) {
		in := faulttest.Injector(t, 9,
			faulttest.HTTPError("catalog.http_500", "catalog", 0.5, 500, 0),
			faulttest.Latency("payment.latency", "payment", 1, 30, 10),
			target,
			faulttest.Truncate("payment.truncate", "payment", 0.2, 0.5),
		)
		if got := firedBy(run(in, calls), target.Id); !slices.Equal(got, want) {
			t.Fatal("adding unrelated rules changed payment.http_503's firing sequence")
		}
	})
	t.Run("shadowing abort", func(t *testing.T) {
		shadow := faulttest.HTTPError("payment.http_401", "payment", 0.5, 401, 0)
		outs := run(faulttest.Injector(t, 9, shadow, target), calls)
		got, shadowed := firedBy(outs, target.Id), firedBy(outs, shadow.Id)
		for i := range calls {
			if got[i] != (want[i] && !shadowed[i]) {
				t.Fatalf("call %d: fired %v, alone %v, shadowed %v", i, got[i], want[i], shadowed[i])
			}
		}
	})
}

func TestInjectorFiringRate(t *testing.T) {
	const n = 100_000
	for _, p := range []float64{0.01, 0.3} {
		in := faulttest.Injector(t, 5, faulttest.HTTPError("payment.http_429", "payment", p, 429, 100))
		hits := 0
		for i := 0; i < n; i++ {
			if in.Call("payment", "payment.pay", 0).Status == 429 {
				hits++
			}
		}
		within5Sigma(t, "http_429 fired", hits, n, p)
	}
}

func TestInjectorLatencyDistribution(t *testing.T) {
	const n = 50_000
	in := faulttest.Injector(t, 11, faulttest.Latency("payment.latency", "payment", 1, 100, 20))
	var sum, sumSq float64
	for i := 0; i < n; i++ {
		ms := float64(in.Call("payment", "payment.pay", 0).Latency) / float64(time.Millisecond)
		sum += ms
		sumSq += ms * ms
	}
	mean := sum / n
	sd := math.Sqrt(sumSq/n - mean*mean)
	// Standard errors: 20/sqrt(n) ≈ 0.09 for the mean, 20/sqrt(2n) ≈ 0.06 for the sd;
	// the bounds are five of them.
	if math.Abs(mean-100) > 0.45 {
		t.Errorf("latency mean %.3f ms, want 100 ± 0.45", mean)
	}
	if math.Abs(sd-20) > 0.32 {
		t.Errorf("latency stddev %.3f ms, want 20 ± 0.32", sd)
	}
}

func TestInjectorComposition(t *testing.T) {
	tests := []struct {
		name       string
		rules      []*gauntletv1.FaultRule
		wantStatus uint32
		wantKeep   float64
		wantKinds  []string
		wantBody   int // bytes of a 100-byte body left after Truncate
	}{
		{
			name: "abort before latency, no truncation of an aborted call",
			rules: []*gauntletv1.FaultRule{ // listed in reverse composition order on purpose
				faulttest.Truncate("p.truncate", "payment", 1, 0.25),
				faulttest.Latency("p.latency", "payment", 1, 50, 0),
				faulttest.HTTPError("p.http_503", "payment", 1, 503, 300),
			},
			wantStatus: 503, wantKeep: 1, wantBody: 100,
			wantKinds: []string{catalogue.KindHTTPError, catalogue.KindLatency},
		},
		{
			name: "latency before truncation",
			rules: []*gauntletv1.FaultRule{
				faulttest.Truncate("p.truncate", "payment", 1, 0.25),
				faulttest.Latency("p.latency", "payment", 1, 50, 0),
			},
			wantKeep: 0.25, wantBody: 25,
			wantKinds: []string{catalogue.KindLatency, catalogue.KindTruncate},
		},
		{
			name: "first abort in plan order wins",
			rules: []*gauntletv1.FaultRule{
				faulttest.HTTPError("p.http_401", "payment", 1, 401, 0),
				faulttest.HTTPError("p.http_503", "payment", 1, 503, 300),
			},
			wantStatus: 401, wantKeep: 1, wantBody: 100,
			wantKinds: []string{catalogue.KindHTTPError},
		},
		{
			name: "smallest keep wins",
			rules: []*gauntletv1.FaultRule{
				faulttest.Truncate("p.truncate", "payment", 1, 0.5),
				faulttest.Truncate("p.truncate_severe", "payment.*", 1, 0.1),
			},
			wantKeep: 0.1, wantBody: 10,
			wantKinds: []string{catalogue.KindTruncate, catalogue.KindTruncate},
		},
		{
			name: "other targets do not match",
			rules: []*gauntletv1.FaultRule{
				faulttest.HTTPError("c.http_503", "catalog", 1, 503, 0),
				faulttest.Latency("i.latency", "inventory.get", 1, 50, 0),
			},
			wantKeep: 1, wantBody: 100,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := faulttest.Injector(t, 1, tt.rules...).Call("payment", "payment.pay", 7*time.Millisecond)
			if out.Status != tt.wantStatus || out.Keep != tt.wantKeep {
				t.Errorf("status %d keep %v, want %d and %v", out.Status, out.Keep, tt.wantStatus, tt.wantKeep)
			}
			var kinds []string
			for _, f := range out.Fired {
				kinds = append(kinds, f.Kind)
				if f.AtVirtualNs != int64(7*time.Millisecond) || f.Target != "payment/payment.pay" {
					t.Errorf("fired %v: wrong time or target", f)
				}
			}
			if !slices.Equal(kinds, tt.wantKinds) {
				t.Errorf("fired kinds %v, want %v", kinds, tt.wantKinds)
			}
			if got := len(out.Truncate(make([]byte, 100))); got != tt.wantBody {
				t.Errorf("Truncate left %d bytes, want %d", got, tt.wantBody)
			}
		})
	}
}

func TestInjectorOutcomeDetails(t *testing.T) {
	out := faulttest.Injector(t, 1,
		faulttest.HTTPError("p.http_429", "payment", 1, 429, 250),
		faulttest.Latency("p.latency", "payment", 1, 40, 0),
	).Call("payment", "payment.pay", 0)
	if out.RetryAfter != 250*time.Millisecond || out.Latency != 40*time.Millisecond {
		t.Errorf("retry after %v latency %v, want 250ms and 40ms", out.RetryAfter, out.Latency)
	}
	details := []string{out.Fired[0].Detail, out.Fired[1].Detail}
	if want := []string{"status=429 retry_after_ms=250", "latency_ms=40.0"}; !slices.Equal(details, want) {
		t.Errorf("details %q, want %q", details, want)
	}
}

func TestOutcomeTruncate(t *testing.T) {
	body := []byte("0123456789")
	tests := []struct {
		name string
		o    inject.Outcome
		want string
	}{
		{"untouched", inject.Outcome{Keep: 1}, "0123456789"},
		{"half", inject.Outcome{Keep: 0.5}, "01234"},
		{"nothing", inject.Outcome{Keep: 0}, ""},
		{"aborted", inject.Outcome{Status: 503, Keep: 0.5}, "0123456789"},
		{"negative keep", inject.Outcome{Keep: -3}, ""},
		{"keep above 1", inject.Outcome{Keep: 7}, "0123456789"},
		{"NaN keep", inject.Outcome{Keep: math.NaN()}, "0123456789"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(tt.o.Truncate(body)); got != tt.want {
				t.Errorf("Truncate = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestMatches(t *testing.T) {
	tests := []struct {
		target string
		want   bool
	}{
		{"*", true},
		{"payment", true},
		{"payment.*", true},
		{"payment.pay", true},
		{"payment.refund", false},
		{"pay", false},
		{"catalog", false},
		{"catalog.*", false},
	}
	for _, tt := range tests {
		if got := catalogue.Matches(tt.target, "payment", "payment.pay"); got != tt.want {
			t.Errorf("Matches(%q, payment, payment.pay) = %v, want %v", tt.target, got, tt.want)
		}
	}
}

func TestInjectorWithoutPlan(t *testing.T) {
	var nilInjector *inject.Injector
	if out := nilInjector.Call("payment", "payment.pay", 0); out.Keep != 1 || out.Status != 0 || len(out.Fired) != 0 {
		t.Errorf("nil injector: %+v", out)
	}
	in, err := inject.NewInjector(nil)
	if err != nil {
		t.Fatal(err)
	}
	if out := in.Call("payment", "payment.pay", 0); out.Keep != 1 || len(out.Fired) != 0 {
		t.Errorf("empty plan: %+v", out)
	}
	if _, err := inject.NewInjector(&gauntletv1.FaultPlan{Rules: []*gauntletv1.FaultRule{{Id: "x"}}}); err == nil {
		t.Error("NewInjector accepted an invalid plan")
	}
}

func BenchmarkInjectorCall(b *testing.B) {
	in, err := inject.NewInjector(mustPlan(b, 1, plans.ProfileEdge, shopServices))
	if err != nil {
		b.Fatal(err)
	}
	calls := script(1024)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		c := calls[i%len(calls)]
		in.Call(c.service, c.tool, time.Duration(i))
		i++
	}
}
