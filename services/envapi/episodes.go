package envapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/errkind"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/play"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// episode is one live episode of the API. mu is held for the length of each step, close
// or snapshot; the fields below it belong to whoever holds it.
type episode struct {
	id, tenant string
	info       *gauntletv1.ResetInfo
	started    time.Time
	lastUsed   atomic.Int64 // unix nanoseconds of the last call that touched it
	// stepping is the one-action-at-a-time rule: set while a trainer's step runs. It is
	// not mu, which the server's own housekeeping (the reaper flushing an idle episode's
	// steps, Close) also takes: a step that met the reaper there was refused as "already
	// in flight", a spurious error the trainer had done nothing to cause.
	stepping atomic.Bool

	mu      sync.Mutex
	sess    *play.Session
	actions []env.Action // so far, for Snapshot (replayed by Fork)
	// diffs are the steps' recorded diffs so far, kept only for an env with outside
	// state (env.OutsideState: an MCP server), whose fork's replay must reproduce them.
	diffs   []string
	outside bool
	lastObs string
	over    bool
}

func (e *episode) touch() { e.lastUsed.Store(time.Now().UnixNano()) }

// tombstone remembers an ended episode for a while, so late calls get a clear answer.
type tombstone struct {
	tenant string
	steps  uint32
	reason gauntletv1.TerminationReason
	why    string
	at     time.Time
}

// snapshot is a point of an episode: its request, plan and actions so far, and what the
// last of them observed (which a fork's replay must observe too).
type snapshot struct {
	tenant string
	// episode is the episode snapshotted: a fork records it as its parent, at the
	// step len(actions).
	episode string
	reset   *gauntletv1.ResetRequest
	plan    *gauntletv1.FaultPlan
	actions []env.Action
	diffs   []string // for an env with outside state (episode.diffs)
	lastObs string
	at      time.Time
}

// tombstoneKeep is how long ended episodes are remembered; snapshotKeep how long
// snapshots are kept; maxSnapshots caps a tenant's snapshots.
const (
	tombstoneKeep = 10 * time.Minute
	snapshotKeep  = time.Hour
	maxSnapshots  = 4096
	maxPolicyName = 64
)

// quota returns the tenant's cap on live episodes.
func (s *Service) quota(t *Tenant) int {
	if t.MaxEpisodes > 0 {
		return t.MaxEpisodes
	}
	return s.cfg.MaxEpisodes
}

// overQuota is RESOURCE_EXHAUSTED (HTTP 429) with a Retry-After.
func overQuota(msg string) error {
	err := connect.NewError(connect.CodeResourceExhausted, errors.New(msg))
	err.Meta().Set("Retry-After", "1")
	return err
}

// reserve takes one of the tenant's episode slots, or fails with 429.
func (s *Service) reserve(t *Tenant) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	total := 0
	for _, n := range s.perTenant {
		total += n
	}
	if q := s.quota(t); s.perTenant[t.Name] >= q {
		return overQuota(fmt.Sprintf("tenant %s already has %d live episodes, its quota; Close one (idle ones are reaped after %v)", t.Name, q, s.cfg.IdleTimeout))
	}
	if total >= s.cfg.ServerMaxEpisodes {
		return overQuota(fmt.Sprintf("the server runs %d episodes, its cap; retry later", total))
	}
	s.perTenant[t.Name]++
	return nil
}

func (s *Service) release(t string) {
	s.mu.Lock()
	s.perTenant[t]--
	s.mu.Unlock()
}

// find returns the tenant's live episode, or the error a call on it gets: NOT_FOUND for
// an unknown id or another tenant's, FAILED_PRECONDITION for an ended one, and for one
// of the tenant's that this API issued before it restarted (serverRestarted).
func (s *Service) find(t *Tenant, id string) (*episode, error) {
	if id == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("episode_id: must not be empty"))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.live[id]; ok && e.tenant == t.Name {
		return e, nil
	}
	if ts, ok := s.ended[id]; ok && ts.tenant == t.Name {
		return nil, endedError(id, ts)
	}
	if s.ids.issuedBefore(runID(t.Name), id) {
		return nil, serverRestarted(id)
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("episode_id: no episode %q", id))
}

// errServerRestarted is what a call on an episode the API ran before it restarted
// wraps: its state went with the old process, so the call can never succeed.
var errServerRestarted = errors.New("episode over: the server restarted")

// ReasonServerRestarted is the reason of the google.rpc.ErrorInfo detail on the error a
// call on an episode from before a restart gets (docs/envapi.md); clients act on it
// (Reset) without reading the message.
const ReasonServerRestarted = "SERVER_RESTARTED"

// serverRestarted is FAILED_PRECONDITION, like any call on an episode that is over (the
// caller resets, as it would after any end; UNAVAILABLE would have it retry a call that
// never succeeds), with an ErrorInfo detail saying why.
func serverRestarted(id string) error {
	err := connect.NewError(connect.CodeFailedPrecondition,
		fmt.Errorf("%w: episode %s was live before the env API restarted and did not survive it; Reset starts a new one", errServerRestarted, id))
	if d, derr := connect.NewErrorDetail(&errdetails.ErrorInfo{
		Reason: ReasonServerRestarted, Domain: "gauntlet.v1.EnvService", Metadata: map[string]string{"episode_id": id},
	}); derr == nil {
		err.AddDetail(d)
	}
	return err
}

func endedError(id string, ts *tombstone) error {
	why := ""
	if ts.why != "" {
		why = ": " + ts.why
	}
	return connect.NewError(connect.CodeFailedPrecondition,
		fmt.Errorf("episode %s is over (%s after %d steps%s); Reset starts a new one", id, reasonName(ts.reason), ts.steps, why))
}

func reasonName(r gauntletv1.TerminationReason) string {
	if r == gauntletv1.TerminationReason_TERMINATION_REASON_UNSPECIFIED {
		return "closed"
	}
	return r.Name()
}

// endLocked ends e with end (which publishes its ended event) and moves it to the
// tombstones. The caller holds e.mu. The returned error is the publish's.
func (s *Service) endLocked(ctx context.Context, e *episode, end func(context.Context) error) error {
	if e.over {
		return nil
	}
	e.over = true
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	err := end(pctx)
	cancel()
	if err != nil {
		s.log.Error("envapi: publish an episode's end", "episode_id", e.id, "err", err)
	}
	if cerr := e.sess.Close(); cerr != nil {
		s.log.Warn("envapi: close an episode", "episode_id", e.id, "err", cerr)
	}
	ended := e.sess.Ended
	s.mu.Lock()
	delete(s.live, e.id)
	s.perTenant[e.tenant]--
	s.ended[e.id] = &tombstone{tenant: e.tenant, steps: ended.Steps, reason: ended.Reason, why: ended.Error, at: time.Now()}
	s.mu.Unlock()
	s.active.Add(ctx, -1)
	s.episodes.Add(ctx, 1)
	if cut := e.sess.CutBytes(); cut > 0 {
		s.cut.Add(ctx, int64(cut))
	}
	return err
}

// ListEnvs lists the registered envs.
func (s *Service) ListEnvs(context.Context, *connect.Request[gauntletv1.ListEnvsRequest]) (*connect.Response[gauntletv1.ListEnvsResponse], error) {
	out := &gauntletv1.ListEnvsResponse{}
	for _, name := range env.Names() {
		e, err := env.Lookup(name)
		if err != nil {
			continue
		}
		out.Envs = append(out.Envs, &gauntletv1.EnvSummary{Name: name, Description: e.Spec().Description})
	}
	return connect.NewResponse(out), nil
}

var componentDocs = map[string]string{
	scoring.ComponentTask:       "progress toward the goal, and success",
	scoring.ComponentCost:       "tool calls and money spent against the budget",
	scoring.ComponentSafety:     "safety events (unsafe or irreversible actions)",
	scoring.ComponentTimeliness: "share of the virtual deadline used",
	scoring.ComponentCausal:     "violated preconditions and invalid actions",
}

// observationSchema is the JSON Schema of every env's decoded observation: a JSON object
// (the envtest suite holds every env to it); its members are the env's own, described in
// its doc page.
const observationSchema = `{"type":"object"}`

// DescribeEnv returns an env's tools, its action and observation spaces, parameters and
// reward components.
func (s *Service) DescribeEnv(_ context.Context, req *connect.Request[gauntletv1.DescribeEnvRequest]) (*connect.Response[gauntletv1.DescribeEnvResponse], error) {
	e, err := env.Lookup(req.Msg.GetEnv())
	if err != nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("env: %w", err))
	}
	sp := e.Spec()
	out := &gauntletv1.DescribeEnvResponse{
		Name: sp.Name, Description: sp.Description, DefaultMaxSteps: sp.DefaultMaxSteps,
		FaultProfiles: plans.Profiles(), Services: sp.Services,
	}
	for _, t := range sp.Tools {
		out.Tools = append(out.Tools, &gauntletv1.ToolSpec{Name: t.Name, Service: t.Service, Description: t.Description, SchemaJson: string(t.Schema)})
	}
	// The action space carries the tools themselves, so a Gymnasium client builds its
	// space from one field; the top-level list stays for older clients.
	out.ActionSpace = &gauntletv1.ActionSpace{Tools: out.Tools, MaxArgsBytes: env.MaxArgsBytes}
	out.ObservationSpace = &gauntletv1.ObservationSpace{Encoding: "json", SchemaJson: observationSchema}
	for _, p := range sp.Params {
		out.Params = append(out.Params, &gauntletv1.ParamSpec{Name: p.Name, Type: p.Type, Default: p.Default, Description: p.Description})
	}
	rs := scoring.SpecFor(sp.Name)
	out.RewardSpecVersion = rs.Version
	for _, w := range rs.Weights {
		out.RewardComponents = append(out.RewardComponents, &gauntletv1.RewardComponentSpec{Name: w.Component, Weight: w.Weight, Description: componentDocs[w.Component]})
	}
	return connect.NewResponse(out), nil
}

// Reset starts an episode.
func (s *Service) Reset(ctx context.Context, req *connect.Request[gauntletv1.ResetRequest]) (*connect.Response[gauntletv1.ResetResponse], error) {
	out, err := s.start(ctx, tenantOf(ctx), req.Msg, nil)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

// validateReset checks a reset request before any slot or plan is taken; errors name the
// field.
func (s *Service) validateReset(r *gauntletv1.ResetRequest) (env.Env, error) {
	// The env validates its parameters when it builds an episode; no faults needed here.
	e, err := s.deps.Check(&gauntletv1.EpisodeRequested{Env: r.GetEnv(), ParamsJson: r.GetParamsJson(), Seed: r.GetSeed(), MaxSteps: r.GetMaxSteps()})
	if e == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	if p := r.GetProfile(); p != "" && !slices.Contains(plans.Profiles(), p) {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("profile: unknown profile %q; known: %v (or empty for the default mix)", p, plans.Profiles()))
	}
	if len(r.GetPolicy()) > maxPolicyName {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("policy: %d bytes is longer than %d", len(r.GetPolicy()), maxPolicyName))
	}
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	return e, nil
}

// start makes a live episode: a slot of the tenant's quota, a fault plan from the faults
// service (or the snapshot's, for a fork), the env episode reset and its started event
// published; a fork's snapshot actions are replayed through the pipeline before the
// episode is handed out.
func (s *Service) start(ctx context.Context, t *Tenant, r *gauntletv1.ResetRequest, from *snapshot) (*gauntletv1.ResetResponse, error) {
	var plan *gauntletv1.FaultPlan
	var replay []env.Action
	if from != nil {
		plan, replay = from.plan, from.actions
	}
	e, err := s.validateReset(r)
	if err != nil {
		return nil, err
	}
	if err := s.reserve(t); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			s.release(t.Name)
		}
	}()
	maxSteps := r.GetMaxSteps()
	if maxSteps == 0 {
		maxSteps = e.Spec().DefaultMaxSteps
	}
	req := &gauntletv1.EpisodeRequested{
		EpisodeId: s.ids.issue(runID(t.Name)), RunId: runID(t.Name),
		Index: s.index.Add(1), Env: r.GetEnv(), ParamsJson: r.GetParamsJson(), Seed: r.GetSeed(),
		Policy: envOr(r.GetPolicy(), "trainer"), MaxSteps: maxSteps, RequestedAtUnixNano: time.Now().UnixNano(),
	}
	if from != nil {
		req.ParentEpisodeId, req.ParentStep = from.episode, uint32(len(from.actions))
	}
	sctx, cancel := context.WithTimeout(ctx, s.cfg.StartTimeout)
	defer cancel()
	if plan == nil {
		if plan, err = s.plan(sctx, req, r.GetProfile()); err != nil {
			return nil, err
		}
	}
	sess := play.NewSession(&gauntletv1.EpisodeAssigned{Episode: req, Plan: plan}, s.cfg.ID, s.scorer,
		&play.Publisher{Bus: s.bus(), Max: s.cfg.SegmentSteps})
	if _, err := sess.Prepare(sctx, s.deps); err != nil {
		_ = sess.Close()
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	obs, err := sess.Reset(sctx, 1)
	if err != nil {
		_ = sess.Close()
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("infra error: %w", err))
	}
	_, outside := e.(env.OutsideState)
	ep := &episode{id: req.EpisodeId, tenant: t.Name, started: time.Now(), sess: sess, lastObs: string(obs), outside: outside}
	ep.info = &gauntletv1.ResetInfo{
		Env: req.Env, Seed: req.Seed, Profile: plan.GetProfile(), MaxSteps: maxSteps, RunId: req.RunId,
		StepTimeoutMs: uint32(s.cfg.StepTimeout.Milliseconds()), EpisodeTimeoutMs: uint32(s.cfg.EpisodeTimeout.Milliseconds()),
		IdleTimeoutMs: uint32(s.cfg.IdleTimeout.Milliseconds()),
	}
	ep.touch()
	if len(replay) > 0 {
		rec := make([]play.Recorded, len(replay))
		for i, act := range replay {
			rec[i] = play.Recorded{Action: act}
			if outside && i < len(from.diffs) {
				rec[i].Diff = []byte(from.diffs[i])
			}
		}
		// The snapshot kept its last observation only: enough to prove the fork is there.
		rec[len(rec)-1].Observation = []byte(from.lastObs)
		// Each replayed step has the step timeout, as a trainer's step would.
		rctx, cancel := context.WithTimeout(s.ctx, s.cfg.StepTimeout*time.Duration(len(replay)))
		turn, diverged, err := sess.Replay(rctx, rec)
		cancel()
		if err != nil {
			fctx, cancel := context.WithTimeout(s.ctx, s.cfg.StepTimeout)
			_ = sess.FinishInfra(fctx, err)
			cancel()
			_ = sess.Close()
			if errors.Is(err, play.ErrDiverged) {
				// Not a passing failure: the env's outside party cannot be forked.
				return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("fork refused: %w", err))
			}
			return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("infra error: %w", err))
		}
		if diverged >= 0 {
			s.log.Warn("envapi: a fork observes something else than its snapshot (an env whose output is not deterministic?)",
				"episode_id", ep.id, "step", diverged)
		}
		ep.actions = append(ep.actions, replay...)
		if outside {
			ep.diffs = append(ep.diffs, from.diffs...) // the replay reproduced them
		}
		ep.lastObs = string(turn.Observation)
	}
	s.mu.Lock()
	s.live[ep.id] = ep
	s.mu.Unlock()
	s.active.Add(ctx, 1)
	ok = true
	return &gauntletv1.ResetResponse{EpisodeId: ep.id, ObservationJson: ep.lastObs, Info: ep.info}, nil
}

// plan asks the faults service for the episode's fault plan.
func (s *Service) plan(ctx context.Context, req *gauntletv1.EpisodeRequested, profile string) (*gauntletv1.FaultPlan, error) {
	preq := &gauntletv1.PlanRequest{Episodes: []*gauntletv1.EpisodeRequested{req}}
	if profile != "" {
		preq.Profiles = []*gauntletv1.Share{{Name: profile, Weight: 1}}
	}
	var reply gauntletv1.PlanReply
	if err := s.bus().Request(ctx, bus.SubjectPlan, preq, &reply); err != nil {
		return nil, connectError(fmt.Errorf("infra error: no fault plan within the start timeout (%v): %w", s.cfg.StartTimeout, err))
	}
	if err := errkind.FromReply(reply.Error, reply.ErrorKind); err != nil {
		return nil, connectError(fmt.Errorf("fault plan: %w", err))
	}
	if len(reply.Plans) != 1 {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("faults service returned %d plans for 1 episode", len(reply.Plans)))
	}
	return reply.Plans[0], nil
}

// Step applies one action.
func (s *Service) Step(ctx context.Context, req *connect.Request[gauntletv1.StepRequest]) (*connect.Response[gauntletv1.StepResult], error) {
	out, err := s.step(ctx, tenantOf(ctx), req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

// step is one step of one episode, for Step and the batches. Call-level problems are
// connect errors; an infra failure during the step is a result flagged infra_error that
// ends the episode as truncated.
func (s *Service) step(ctx context.Context, t *Tenant, r *gauntletv1.StepRequest) (*gauntletv1.StepResult, error) {
	if r.GetAction() == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("action: required ({\"tool\": ..., \"args_json\": ...})"))
	}
	if err := checkTrainer(r.GetTrainer()); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	e, err := s.find(t, r.GetEpisodeId())
	if err != nil {
		return nil, err
	}
	if !e.stepping.CompareAndSwap(false, true) {
		return nil, connect.NewError(connect.CodeAborted, fmt.Errorf("episode %s: a step is already in flight; one action at a time per episode", e.id))
	}
	defer e.stepping.Store(false)
	e.mu.Lock() // waits out housekeeping, which holds it briefly
	defer e.mu.Unlock()
	if e.over {
		s.mu.Lock()
		ts := s.ended[e.id]
		s.mu.Unlock()
		if ts != nil {
			return nil, endedError(e.id, ts)
		}
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("episode %s is over", e.id))
	}
	e.touch()
	if d := time.Since(e.started); d > s.cfg.EpisodeTimeout {
		why := fmt.Sprintf("episode timeout: %v since Reset, more than %v", d.Round(time.Millisecond), s.cfg.EpisodeTimeout)
		_ = s.endLocked(ctx, e, func(c context.Context) error {
			return e.sess.Truncate(c, gauntletv1.TerminationReason_TERMINATION_REASON_TIMEOUT, why)
		})
		return &gauntletv1.StepResult{EpisodeId: e.id, Step: e.sess.Steps(), ObservationJson: e.lastObs, Truncated: true,
			Reason: gauntletv1.TerminationReason_TERMINATION_REASON_TIMEOUT, Info: &gauntletv1.StepInfo{Error: why}}, nil
	}
	act := env.Action{Tool: r.Action.GetTool(), Args: json.RawMessage(r.Action.GetArgsJson())}
	sctx, cancel := context.WithTimeout(s.ctx, s.cfg.StepTimeout)
	st, res, err := e.sess.Step(sctx, act, r.GetTrainer())
	cancel()
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("step timeout (%v): %w", s.cfg.StepTimeout, err)
		}
		why := "infra error: " + err.Error()
		_ = s.endLocked(ctx, e, func(c context.Context) error { return e.sess.FinishInfra(c, err) })
		return &gauntletv1.StepResult{EpisodeId: e.id, Step: e.sess.Steps(), ObservationJson: e.lastObs, Truncated: true,
			Reason: gauntletv1.TerminationReason_TERMINATION_REASON_INFRA_ERROR, Info: &gauntletv1.StepInfo{InfraError: true, Error: why}}, nil
	}
	s.steps.Add(ctx, 1)
	e.actions = append(e.actions, act)
	if e.outside {
		e.diffs = append(e.diffs, st.StateDiffJson)
	}
	e.lastObs = st.ObservationJson
	out := stepResult(st)
	if res.Done() {
		if err := s.endLocked(ctx, e, e.sess.Finish); err != nil {
			out.Info.InfraError = true
			out.Info.Error = "infra error recording the episode's end: " + err.Error()
		}
	}
	return out, nil
}

// maxPolicyVersion bounds a step's policy version (a checkpoint name, a step number).
const maxPolicyVersion = 4 << 10

// checkTrainer holds trainer data to what TrainerData promises, so a trainer learns of
// its mistake at the step instead of reading misaligned rows from trainer_steps later:
// logprobs are one per completion token (or absent, when the trainer keeps them), and
// each is a log-probability: a number, at most 0. Token ids and the policy version
// are the trainer's own, checked only for size: the step is recorded in one event under
// the stream's payload limit, so they are held to play.MaxTrainerTokens token ids and
// maxPolicyVersion bytes (refused, not cut: cut token ids would be misaligned rows).
func checkTrainer(td *gauntletv1.TrainerData) error {
	if td == nil {
		return nil
	}
	if n := len(td.PromptTokenIds) + len(td.CompletionTokenIds); n > play.MaxTrainerTokens {
		return fmt.Errorf("trainer: %d prompt and completion token ids; at most %d per step", n, play.MaxTrainerTokens)
	}
	if len(td.PolicyVersion) > maxPolicyVersion {
		return fmt.Errorf("trainer.policy_version: %d bytes; at most %d", len(td.PolicyVersion), maxPolicyVersion)
	}
	if len(td.Logprobs) == 0 {
		return nil
	}
	if len(td.Logprobs) != len(td.CompletionTokenIds) {
		return fmt.Errorf("trainer.logprobs: %d logprobs for %d completion_token_ids; want one per completion token, or none",
			len(td.Logprobs), len(td.CompletionTokenIds))
	}
	for i, lp := range td.Logprobs {
		if !(lp <= 0) { // NaN fails this too
			return fmt.Errorf("trainer.logprobs[%d]: %v is not a log-probability (want a number at most 0)", i, lp)
		}
	}
	return nil
}

func stepResult(st *gauntletv1.StepTaken) *gauntletv1.StepResult {
	return &gauntletv1.StepResult{
		EpisodeId: st.EpisodeId, Step: st.Step, ObservationJson: st.ObservationJson,
		Reward: st.Score.GetTotal(), RewardComponents: st.Score.Full().GetComponents(),
		Terminated: st.Terminated, Truncated: st.Truncated, Reason: st.Reason,
		Info: &gauntletv1.StepInfo{
			Faults: st.Faults, Signals: st.Signals, Metering: st.Metering,
			VirtualTimeNs: st.VirtualTimeNs, RewardSpecVersion: st.Score.GetSpecVersion(),
		},
	}
}

// Close ends an episode; it is idempotent.
func (s *Service) Close(ctx context.Context, req *connect.Request[gauntletv1.CloseRequest]) (*connect.Response[gauntletv1.CloseResponse], error) {
	out, err := s.close(ctx, tenantOf(ctx), req.Msg.GetEpisodeId(), "closed by the client")
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

// close ends the tenant's episode id as the client's doing (truncated, with the error
// "<by> after N steps"), for Close and an MCP session that ends; an episode already
// over answers how it ended.
func (s *Service) close(ctx context.Context, t *Tenant, id, by string) (*gauntletv1.CloseResponse, error) {
	e, err := s.find(t, id)
	if errors.Is(err, errServerRestarted) {
		// Idempotent: the episode is over, ended by the restart (an infra error); how
		// many steps it took went with the old process.
		return &gauntletv1.CloseResponse{Reason: gauntletv1.TerminationReason_TERMINATION_REASON_INFRA_ERROR}, nil
	}
	if err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) && ce.Code() == connect.CodeFailedPrecondition {
			s.mu.Lock()
			ts := s.ended[id]
			s.mu.Unlock()
			if ts == nil { // forgotten meanwhile
				return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("episode_id: no episode %q", id))
			}
			return &gauntletv1.CloseResponse{Steps: ts.steps, Reason: ts.reason}, nil
		}
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	now := !e.over
	if now {
		n := e.sess.Steps()
		if err := s.endLocked(ctx, e, func(c context.Context) error {
			return e.sess.Truncate(c, gauntletv1.TerminationReason_TERMINATION_REASON_UNSPECIFIED, fmt.Sprintf("%s after %d steps", by, n))
		}); err != nil {
			return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("infra error recording the close: %w", err))
		}
	}
	return &gauntletv1.CloseResponse{ClosedNow: now, Steps: e.sess.Ended.Steps, Reason: e.sess.Ended.Reason}, nil
}

// Snapshot records the episode's request, plan and actions so far (and, for an env with
// outside state, the steps' diffs, which the fork's replay must reproduce). Episodes are
// deterministic, so replaying them from the seed is an exact fork.
func (s *Service) Snapshot(ctx context.Context, req *connect.Request[gauntletv1.SnapshotRequest]) (*connect.Response[gauntletv1.SnapshotResponse], error) {
	t := tenantOf(ctx)
	e, err := s.find(t, req.Msg.GetEpisodeId())
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	if e.over {
		e.mu.Unlock()
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("episode %s is over", e.id))
	}
	e.touch()
	q := e.sess.Req
	snap := &snapshot{
		tenant: t.Name, episode: e.id, plan: e.sess.Plan, actions: slices.Clone(e.actions), diffs: slices.Clone(e.diffs), lastObs: e.lastObs, at: time.Now(),
		reset: &gauntletv1.ResetRequest{Env: q.Env, ParamsJson: q.ParamsJson, Seed: q.Seed, MaxSteps: q.MaxSteps, Policy: q.Policy},
	}
	e.mu.Unlock()
	id := "snap-" + strconv.FormatUint(randUint64(), 16)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, sn := range s.snapshots {
		if sn.tenant == t.Name {
			n++
		}
	}
	if n >= maxSnapshots {
		return nil, overQuota(fmt.Sprintf("tenant %s holds %d snapshots, the most allowed; they expire after %v", t.Name, n, snapshotKeep))
	}
	s.snapshots[id] = snap
	return connect.NewResponse(&gauntletv1.SnapshotResponse{SnapshotId: id, Step: uint32(len(snap.actions))}), nil
}

// Fork starts a new episode from a snapshot by replaying its actions through the
// pipeline (recorded like any steps of the new episode).
func (s *Service) Fork(ctx context.Context, req *connect.Request[gauntletv1.ForkRequest]) (*connect.Response[gauntletv1.ResetResponse], error) {
	t := tenantOf(ctx)
	s.mu.Lock()
	snap, ok := s.snapshots[req.Msg.GetSnapshotId()]
	s.mu.Unlock()
	if !ok || snap.tenant != t.Name {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("snapshot_id: no snapshot %q", req.Msg.GetSnapshotId()))
	}
	out, err := s.start(ctx, t, snap.reset, snap)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

// Health says whether episodes can run: the bus must be connected.
func (s *Service) Health(context.Context, *connect.Request[gauntletv1.HealthRequest]) (*connect.Response[gauntletv1.HealthResponse], error) {
	b := s.bus()
	if b == nil || b.NC == nil || !b.NC.IsConnected() {
		return connect.NewResponse(&gauntletv1.HealthResponse{Status: "not_serving", Detail: "not connected to NATS"}), nil
	}
	return connect.NewResponse(&gauntletv1.HealthResponse{Status: "serving"}), nil
}

// Capacity reports the caller's quota and the server's load.
func (s *Service) Capacity(ctx context.Context, _ *connect.Request[gauntletv1.CapacityRequest]) (*connect.Response[gauntletv1.CapacityResponse], error) {
	t := tenantOf(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	total := 0
	for _, n := range s.perTenant {
		total += n
	}
	return connect.NewResponse(&gauntletv1.CapacityResponse{
		Tenant: t.Name, ActiveEpisodes: uint32(s.perTenant[t.Name]), MaxEpisodes: uint32(s.quota(t)),
		ServerActiveEpisodes: uint32(total), ServerMaxEpisodes: uint32(s.cfg.ServerMaxEpisodes),
	}), nil
}

// reap ends idle and overdue episodes, publishes the pending steps of episodes waiting
// for their trainer, and forgets old tombstones and snapshots.
func (s *Service) reap(ctx context.Context) {
	every := min(s.cfg.IdleTimeout/4, 500*time.Millisecond)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := time.Now()
		s.mu.Lock()
		eps := make([]*episode, 0, len(s.live))
		for _, e := range s.live {
			eps = append(eps, e)
		}
		for id, ts := range s.ended {
			if now.Sub(ts.at) > max(tombstoneKeep, s.cfg.IdleTimeout) {
				delete(s.ended, id)
			}
		}
		for id, sn := range s.snapshots {
			if now.Sub(sn.at) > snapshotKeep {
				delete(s.snapshots, id)
			}
		}
		for key, b := range s.inboxes {
			if now.Sub(b.used) > tombstoneKeep && b.idle() {
				delete(s.inboxes, key)
			}
		}
		s.mu.Unlock()
		for _, e := range eps {
			idle := now.Sub(time.Unix(0, e.lastUsed.Load()))
			if idle < every || !e.mu.TryLock() {
				continue
			}
			switch {
			case e.over:
			case idle > s.cfg.IdleTimeout:
				why := fmt.Sprintf("idle for %v, more than %v: reaped", idle.Round(time.Millisecond), s.cfg.IdleTimeout)
				_ = s.endLocked(ctx, e, func(c context.Context) error {
					return e.sess.Truncate(c, gauntletv1.TerminationReason_TERMINATION_REASON_TIMEOUT, why)
				})
			case now.Sub(e.started) > s.cfg.EpisodeTimeout:
				why := fmt.Sprintf("episode timeout: more than %v since Reset", s.cfg.EpisodeTimeout)
				_ = s.endLocked(ctx, e, func(c context.Context) error {
					return e.sess.Truncate(c, gauntletv1.TerminationReason_TERMINATION_REASON_TIMEOUT, why)
				})
			default:
				if err := e.sess.Flush(); err != nil {
					s.log.Warn("envapi: publish an idle episode's steps", "episode_id", e.id, "err", err)
				}
			}
			e.mu.Unlock()
		}
	}
}
