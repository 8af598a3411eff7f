package inject_test

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/faulttest"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

func specDecider(t *testing.T, seed uint64, yaml string) *inject.Decider {
	t.Helper()
	_, rules, err := plans.ParseSpec([]byte("name: stats\nfaults:\n" + yaml))
	if err != nil {
		t.Fatal(err)
	}
	return inject.NewDecider(seed, rules)
}

var request = catalogue.Event{Layer: catalogue.LayerService, Op: catalogue.OpRequest, Host: "api", Path: "/x", Method: "GET"}

// TestLossRateWithinBinomialBound: 1 % independent loss over 100,000 requests lands within
// 4 binomial standard deviations (about ±126 of 1,000) for every one of 20 seeds.
func TestLossRateWithinBinomialBound(t *testing.T) {
	const n, p = 100_000, 0.01
	sd := math.Sqrt(n * p * (1 - p))
	for seed := uint64(1); seed <= 20; seed++ {
		d := specDecider(t, seed, "  - {id: loss, kind: packet_loss, params: {rate: 0.01}}\n")
		lost := 0
		for range n {
			if d.Decide("k", request).Abort == catalogue.KindPacketLoss {
				lost++
			}
		}
		if math.Abs(float64(lost)-n*p) > 4*sd {
			t.Errorf("seed %d: %d of %d lost, want %v ± %.0f", seed, lost, n, n*p, 4*sd)
		}
	}
}

// TestBurstyLossKeepsRateAndBurstLength: the Gilbert chain's long-run rate is the declared
// rate and its bursts have the declared mean length.
func TestBurstyLossKeepsRateAndBurstLength(t *testing.T) {
	const n = 1_000_000
	d := specDecider(t, 3, "  - {id: loss, kind: packet_loss, params: {rate: 0.02, burst_len: 5}}\n")
	lost, bursts, run := 0, 0, 0
	for range n {
		if d.Decide("k", request).Abort == catalogue.KindPacketLoss {
			lost++
			if run == 0 {
				bursts++
			}
			run++
		} else {
			run = 0
		}
	}
	if rate := float64(lost) / n; math.Abs(rate-0.02) > 0.002 {
		t.Errorf("loss rate %.4f, want 0.02 ± 0.002", rate)
	}
	if mean := float64(lost) / float64(bursts); math.Abs(mean-5) > 0.3 {
		t.Errorf("mean burst length %.2f, want 5 ± 0.3", mean)
	}
}

// TestLatencyMatchesDeclaredDistribution: for each of 5 seeds, 100,000 latency draws have
// the declared mean and standard deviation, and their distribution passes a
// Kolmogorov-Smirnov test against the declared normal at the 0.1 % level, both through the
// Decider and the sim Injector.
func TestLatencyMatchesDeclaredDistribution(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		checkLatencyDistribution(t, seed)
	}
}

func checkLatencyDistribution(t *testing.T, seed uint64) {
	const n, mean, sd = 100_000, 200.0, 30.0
	d := specDecider(t, seed, "  - {id: lat, kind: latency, params: {mean_ms: 200, jitter_ms: 30}}\n")
	in := faulttest.Injector(t, seed, faulttest.Latency("lat", "*", 1, mean, sd))
	for _, src := range []struct {
		name string
		draw func() time.Duration
	}{
		{"decider", func() time.Duration { return d.Decide("k", request).Delay }},
		{"injector", func() time.Duration { return in.Call("payment", "payment.pay", 0).Latency }},
	} {
		xs := make([]float64, n)
		for i := range xs {
			xs[i] = float64(src.draw()) / float64(time.Millisecond)
		}
		var m, v float64
		for _, x := range xs {
			m += x
		}
		m /= n
		for _, x := range xs {
			v += (x - m) * (x - m)
		}
		s := math.Sqrt(v / (n - 1))
		if math.Abs(m-mean) > 5*sd/math.Sqrt(n) {
			t.Errorf("seed %d %s: mean %.3f ms, want %v ± %.3f", seed, src.name, m, mean, 5*sd/math.Sqrt(n))
		}
		if math.Abs(s-sd)/sd > 0.02 {
			t.Errorf("seed %d %s: sd %.3f ms, want %v ± 2 %%", seed, src.name, s, sd)
		}
		slices.Sort(xs)
		var ks float64
		for i, x := range xs {
			c := 0.5 * math.Erfc(-(x-mean)/(sd*math.Sqrt2))
			ks = math.Max(ks, math.Max(math.Abs(c-float64(i)/n), math.Abs(float64(i+1)/n-c)))
		}
		if crit := 1.95 / math.Sqrt(n); ks > crit {
			t.Errorf("seed %d %s: KS statistic %.5f above the 0.1 %% critical value %.5f", seed, src.name, ks, crit)
		}
	}
}

// TestErrorProbabilityWithinBinomialBound checks a plan rule's firing rate in the sim.
func TestErrorProbabilityWithinBinomialBound(t *testing.T) {
	const n, p = 100_000, 0.03
	in := faulttest.Injector(t, 5, faulttest.HTTPError("e", "*", p, 503, 0))
	hits := 0
	for range n {
		if in.Call("payment", "payment.pay", 0).Status == 503 {
			hits++
		}
	}
	within5Sigma(t, "http_503", hits, n, p)
}

// TestCompositionOrder: an abort wins over everything after it, a delay still applies to
// an aborted call, rewrites never touch an aborted one; a later abort is shadowed.
func TestCompositionOrder(t *testing.T) {
	d := specDecider(t, 1, `
  - {id: cut, kind: truncate, params: {keep_fraction: 0.5}}
  - {id: slow, kind: latency, params: {mean_ms: 50}}
  - {id: e429, kind: http_error, params: {status: 429, retry_after_ms: 1000}}
  - {id: e503, kind: http_error, params: {status: 503}}
`)
	dec := d.Decide("k", request)
	if dec.Abort != catalogue.KindHTTPError || dec.Status != 429 || dec.RetryAfter != time.Second {
		t.Fatalf("abort %q status %d: want the first abort, 429", dec.Abort, dec.Status)
	}
	if dec.Delay != 50*time.Millisecond || dec.Keep != 1 {
		t.Fatalf("delay %v keep %v: want 50 ms and no rewrite", dec.Delay, dec.Keep)
	}
	var ids []string
	for _, f := range dec.Fired {
		ids = append(ids, f.RuleID)
	}
	if !slices.Equal(ids, []string{"e429", "slow"}) {
		t.Fatalf("fired %v, want [e429 slow] in composition order", ids)
	}
	// Targets: the rewrite applies when nothing aborts.
	d = specDecider(t, 1, `
  - {id: e, kind: http_error, match: {methods: [POST]}}
  - {id: cut, kind: truncate, match: {hosts: ["api"], paths: ["/x"]}, params: {keep_fraction: 0.5}}
`)
	if dec := d.Decide("k", request); dec.Abort != "" || dec.Keep != 0.5 {
		t.Fatalf("GET: abort %q keep %v, want no abort and keep 0.5", dec.Abort, dec.Keep)
	}
	post := request
	post.Method = "post"
	if dec := d.Decide("k", post); dec.Abort == "" || dec.Keep != 1 {
		t.Fatalf("POST: abort %q keep %v, want the error and no rewrite", dec.Abort, dec.Keep)
	}
}

// TestDecisionsArePerKey: a stream's faults do not depend on other streams' events.
func TestDecisionsArePerKey(t *testing.T) {
	const yaml = "  - {id: e, kind: http_error, probability: 0.3}\n  - {id: l, kind: latency, params: {mean_ms: 10, jitter_ms: 5}}\n"
	a := specDecider(t, 77, yaml)
	b := specDecider(t, 77, yaml)
	var seqA, seqB []catalogue.Decision
	for i := range 200 {
		seqA = append(seqA, a.Decide("conn/1", request))
		if i%3 == 0 {
			b.Decide("conn/2", request) // interleaved traffic on another stream
		}
		seqB = append(seqB, b.Decide("conn/1", request))
	}
	for i := range seqA {
		if seqA[i].Status != seqB[i].Status || seqA[i].Delay != seqB[i].Delay {
			t.Fatalf("event %d differs with interleaving: %+v vs %+v", i, seqA[i], seqB[i])
		}
	}
	c := specDecider(t, 78, yaml)
	same := 0
	for range 200 {
		if c.Decide("conn/1", request).Delay == a.Decide("conn/1", request).Delay {
			same++
		}
	}
	if same > 2 {
		t.Fatalf("seeds 77 and 78 agreed on %d of 200 latencies", same)
	}
}

func TestRulesFromPlanDecideLikeTheInjector(t *testing.T) {
	plan, err := plans.Derive(12, plans.ProfileStress, shopServices)
	if err != nil {
		t.Fatal(err)
	}
	in, _ := inject.NewInjector(plan)
	d := inject.NewDecider(plan.Seed, catalogue.RulesFromPlan(plan))
	// The injector keys draws by rule id; the decider by rule id and stream. Both must
	// honour the same probabilities: compare fire counts per rule over many calls.
	const n = 20_000
	countIn, countD := map[string]int{}, map[string]int{}
	for range n {
		for _, f := range in.Call("payment", "payment.pay", 0).Fired {
			countIn[f.FaultId]++
		}
		ev := catalogue.Event{Layer: catalogue.LayerService, Op: catalogue.OpRequest, Service: "payment", Tool: "payment.pay"}
		for _, f := range d.Decide("s", ev).Fired {
			countD[f.RuleID]++
		}
	}
	for _, r := range plan.Rules {
		if r.Target != "payment" {
			if countD[r.Id] != 0 {
				t.Errorf("%s (target %s) fired on payment", r.Id, r.Target)
			}
			continue
		}
		a, b := float64(countIn[r.Id]), float64(countD[r.Id])
		if math.Abs(a-b) > 6*math.Sqrt(n*0.25)+1 {
			t.Errorf("%s: injector fired %v, decider %v", r.Id, a, b)
		}
	}
	_ = gauntletv1.FaultPlan{}
}

// TestLatencyDistributionsKeepDeclaredMoments: lognormal and uniform latency have the
// declared mean and standard deviation; lognormal passes a KS test against its CDF at the
// 0.1 % level, uniform stays within mean ± sd·√3.
func TestLatencyDistributionsKeepDeclaredMoments(t *testing.T) {
	const n, mean, sd = 100_000, 200.0, 80.0
	for _, dist := range []string{"lognormal", "uniform"} {
		d := specDecider(t, 4, "  - {id: lat, kind: latency, params: {mean_ms: 200, jitter_ms: 80, distribution: "+dist+"}}\n")
		xs := make([]float64, n)
		var m float64
		for i := range xs {
			xs[i] = float64(d.Decide("k", request).Delay) / float64(time.Millisecond)
			m += xs[i]
		}
		m /= n
		var v float64
		for _, x := range xs {
			v += (x - m) * (x - m)
		}
		s := math.Sqrt(v / (n - 1))
		if math.Abs(m-mean) > 6*sd/math.Sqrt(n) || math.Abs(s-sd)/sd > 0.03 {
			t.Errorf("%s: mean %.2f sd %.2f, want %v and %v", dist, m, s, mean, sd)
		}
		slices.Sort(xs)
		switch dist {
		case "lognormal":
			s2 := math.Log1p(sd * sd / (mean * mean))
			mu, sigma := math.Log(mean)-s2/2, math.Sqrt(s2)
			var ks float64
			for i, x := range xs {
				c := 0.5 * math.Erfc(-(math.Log(x)-mu)/(sigma*math.Sqrt2))
				ks = math.Max(ks, math.Max(math.Abs(c-float64(i)/n), math.Abs(float64(i+1)/n-c)))
			}
			if crit := 1.95 / math.Sqrt(n); ks > crit {
				t.Errorf("lognormal: KS %.5f above %.5f", ks, crit)
			}
		case "uniform":
			half := sd * math.Sqrt(3)
			if xs[0] < mean-half-1e-6 || xs[n-1] > mean+half+1e-6 {
				t.Errorf("uniform: range [%.2f, %.2f] outside mean ± %.2f", xs[0], xs[n-1], half)
			}
		}
	}
}
