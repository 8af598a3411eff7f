package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	sdklog "go.temporal.io/sdk/log"

	"github.com/gauntlet-rl/gauntlet/workflows"
)

// Bounds on the curriculum pages' reads.
const (
	// MaxCurricula bounds the curricula list.
	MaxCurricula = 200
	// maxBatches bounds the batches (runs) of one curriculum the page charts.
	maxBatches = 5000
	// progressTimeout bounds the progress query: a curriculum whose worker is gone
	// answers nothing, and the page then shows what the memo says.
	progressTimeout = 2 * time.Second
)

// Curriculum states the console shows besides the workflow's own (workflows.Status*):
// what Temporal says of a curriculum that closed without setting its memo's state.
const (
	StateTerminated = "terminated"
	StateFailed     = "failed"
	StateTimedOut   = "timed_out"
	StateCanceled   = "canceled"
)

// errNoTemporal is a console without a Temporal server to read curricula from (503).
var errNoTemporal = errors.New("temporal unavailable")

// errUnauthorized is an action without a valid token (401); errReadOnly an action on a
// console that takes none (403).
var (
	errUnauthorized = errors.New("unauthorized")
	errReadOnly     = errors.New("read-only")
)

// temporalClient returns the console's Temporal client, dialling it on first use and
// again after a failed attempt.
func (c *Console) temporalClient(ctx context.Context) (client.Client, error) {
	c.tmu.Lock()
	defer c.tmu.Unlock()
	if c.tc != nil {
		return c.tc, nil
	}
	addr := ""
	if c.cfg.Temporal != nil {
		addr = c.cfg.Temporal()
	}
	if addr == "" {
		return nil, fmt.Errorf("%w: no Temporal server (curricula need the temporal module or --temporal)", errNoTemporal)
	}
	tc, err := client.DialContext(ctx, client.Options{
		HostPort: addr, Namespace: c.cfg.Namespace,
		Logger: sdklog.NewStructuredLogger(c.log.With("component", "temporal-client")),
	})
	if err != nil {
		return nil, fmt.Errorf("%w: dial %s: %w", errNoTemporal, addr, err)
	}
	c.tc = tc
	return tc, nil
}

// CurriculumSummary is one curriculum as the curricula list shows it: Temporal's view
// (state, stage, times) and ClickHouse's counts of its batches' episodes.
type CurriculumSummary struct {
	ID    string `json:"id"`
	Name  string `json:"name"`
	State string `json:"state"`
	// Open is whether the workflow still runs (paused counts as open).
	Open      bool      `json:"open"`
	Stage     int       `json:"stage"`
	StageName string    `json:"stage_name"`
	Started   time.Time `json:"started"`
	// Closed is when the workflow closed; nil while it runs.
	Closed      *time.Time `json:"closed,omitempty"`
	SubmittedBy string     `json:"submitted_by"`
	Runs        uint64     `json:"runs"`
	Episodes    uint64     `json:"episodes"`
	Successes   uint64     `json:"successes"`
	SuccessRate float64    `json:"success_rate"`
	// InfraErrors is how many of Episodes ended as infra errors; SuccessRate leaves them
	// out (the batches give them by kind).
	InfraErrors uint64 `json:"infra_errors"`
	// PauseReason says why the curriculum paused itself (a batch mostly of infra errors),
	// from its memo; empty otherwise.
	PauseReason string `json:"pause_reason,omitempty"`
}

// summaryOf reads a curriculum's state, stage and times from Temporal's record of it.
// The memo's state is the curriculum's own (running, paused, completed, stopped,
// skipped, aborted); a workflow that closed otherwise (terminated, failed, timed out)
// says so, whatever the memo last held.
func summaryOf(info *workflowpb.WorkflowExecutionInfo) CurriculumSummary {
	s := CurriculumSummary{ID: info.GetExecution().GetWorkflowId(), Started: info.GetStartTime().AsTime()}
	fields := info.GetMemo().GetFields()
	memo := func(name string, v any) {
		if p, ok := fields[name]; ok {
			_ = converter.GetDefaultDataConverter().FromPayload(p, v)
		}
	}
	memo(workflows.MemoState, &s.State)
	memo(workflows.MemoStage, &s.Stage)
	memo(workflows.MemoStageName, &s.StageName)
	memo(workflows.MemoSubmittedBy, &s.SubmittedBy)
	memo(workflows.MemoPauseReason, &s.PauseReason)
	switch info.GetStatus() {
	case enums.WORKFLOW_EXECUTION_STATUS_RUNNING:
		s.Open = true
		if s.State == "" {
			s.State = workflows.StatusRunning
		}
	case enums.WORKFLOW_EXECUTION_STATUS_CANCELED:
		// An aborted curriculum closes as canceled; one canceled from outside keeps
		// whatever its memo said while it ran.
		if s.State != workflows.StatusAborted {
			s.State = StateCanceled
		}
	case enums.WORKFLOW_EXECUTION_STATUS_TERMINATED:
		s.State = StateTerminated
	case enums.WORKFLOW_EXECUTION_STATUS_FAILED:
		s.State = StateFailed
	case enums.WORKFLOW_EXECUTION_STATUS_TIMED_OUT:
		s.State = StateTimedOut
	default: // completed (or continued as new, which the list never shows)
		if s.State == "" || s.State == workflows.StatusRunning || s.State == workflows.StatusPaused {
			s.State = workflows.StatusCompleted
		}
	}
	if !s.Open && info.GetCloseTime() != nil {
		t := info.GetCloseTime().AsTime()
		s.Closed = &t
	}
	return s
}

// CurriculaPage is the answer of /console/api/curricula.
type CurriculaPage struct {
	Curricula []CurriculumSummary `json:"curricula"`
}

// curricula and curriculum ask Temporal first, then ClickHouse: a console without
// Temporal says so whatever ClickHouse's state.
func (c *Console) curricula(ctx context.Context, _ *http.Request, p params) (any, error) {
	tc, err := c.temporalClient(ctx)
	if err != nil {
		return nil, err
	}
	rd, err := c.reader(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := tc.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{
		Namespace: c.namespace(), PageSize: int32(p["limit"]),
		// A curriculum that continued as new is listed once per run of its chain; the
		// open (or last) run stands for it.
		Query: fmt.Sprintf("WorkflowType = '%s' AND ExecutionStatus != 'ContinuedAsNew'", workflows.WorkflowCurriculum),
	})
	if err != nil {
		return nil, fmt.Errorf("list curricula: %w", err)
	}
	out := CurriculaPage{Curricula: []CurriculumSummary{}}
	ids := []string{}
	for _, info := range resp.GetExecutions() {
		if len(out.Curricula) == p["limit"] {
			break
		}
		if info.GetStatus() == enums.WORKFLOW_EXECUTION_STATUS_CONTINUED_AS_NEW {
			continue
		}
		out.Curricula = append(out.Curricula, summaryOf(info))
		ids = append(ids, info.GetExecution().GetWorkflowId())
	}
	counts, err := rd.CurriculumCounts(ctx, ids)
	if err != nil {
		return nil, err
	}
	for i := range out.Curricula {
		s := &out.Curricula[i]
		if n, ok := counts[s.ID]; ok {
			s.Name, s.Runs, s.Episodes, s.Successes, s.InfraErrors = n.Name, n.Runs, n.Episodes, n.Successes, n.InfraErrors
			s.SuccessRate = ratio(float64(n.Successes), scored(n.Episodes, n.InfraErrors))
		}
	}
	return out, nil
}

func (c *Console) namespace() string {
	if c.cfg.Namespace == "" {
		return "default"
	}
	return c.cfg.Namespace
}

// describeCurriculum returns Temporal's record of the curriculum id; errNotFound when
// there is none or the workflow is not a curriculum (the console steers curricula only).
func (c *Console) describeCurriculum(ctx context.Context, tc client.Client, id string) (*workflowpb.WorkflowExecutionInfo, error) {
	d, err := tc.DescribeWorkflow(ctx, id, "")
	if err != nil {
		var nf *serviceerror.NotFound
		if errors.As(err, &nf) {
			return nil, fmt.Errorf("curriculum %s: %w", id, errNotFound)
		}
		return nil, fmt.Errorf("describe curriculum %s: %w", id, err)
	}
	info := d.RawResponse.GetWorkflowExecutionInfo()
	if t := info.GetType().GetName(); t != workflows.WorkflowCurriculum {
		return nil, fmt.Errorf("workflow %s is a %s, not a curriculum: %w", id, t, errNotFound)
	}
	return info, nil
}

// CurriculumPage is the answer of /console/api/curricula/{curriculum}: the curriculum
// as the list shows it, the workflow's live progress (nil when no worker answers its
// query: the memo's state and stage are then all Temporal says), the stages it closed
// and its batches in order.
type CurriculumPage struct {
	Curriculum CurriculumSummary   `json:"curriculum"`
	Progress   *workflows.Progress `json:"progress"`
	Stages     []StageRow          `json:"stages"`
	Batches    []BatchPoint        `json:"batches"`
	// Selectors names the drift selectors, in the order of each batch's Drift.
	Selectors []string `json:"selectors"`
	// Actions says whether the console takes actions at all (with a token).
	Actions bool `json:"actions"`
}

func (c *Console) curriculum(ctx context.Context, r *http.Request, _ params) (any, error) {
	id := r.PathValue("curriculum")
	tc, err := c.temporalClient(ctx)
	if err != nil {
		return nil, err
	}
	rd, err := c.reader(ctx)
	if err != nil {
		return nil, err
	}
	info, err := c.describeCurriculum(ctx, tc, id)
	if err != nil {
		return nil, err
	}
	p := CurriculumPage{Curriculum: summaryOf(info), Actions: c.cfg.Authorize != nil}
	if p.Curriculum.Open {
		qctx, cancel := context.WithTimeout(ctx, progressTimeout)
		if v, err := tc.QueryWorkflow(qctx, id, "", workflows.QueryProgress); err == nil {
			var prog workflows.Progress
			if v.Get(&prog) == nil {
				p.Progress = &prog
			}
		}
		cancel()
	}
	if p.Stages, err = rd.CurriculumStages(ctx, id); err != nil {
		return nil, err
	}
	if p.Batches, p.Selectors, err = rd.CurriculumBatches(ctx, id); err != nil {
		return nil, err
	}
	counts, err := rd.CurriculumCounts(ctx, []string{id})
	if err != nil {
		return nil, err
	}
	if n, ok := counts[id]; ok {
		s := &p.Curriculum
		s.Name, s.Runs, s.Episodes, s.Successes, s.InfraErrors = n.Name, n.Runs, n.Episodes, n.Successes, n.InfraErrors
		s.SuccessRate = ratio(float64(n.Successes), scored(n.Episodes, n.InfraErrors))
	}
	return p, nil
}

// Signals the console sends, in the order its buttons show them.
var consoleSignals = []string{workflows.SignalPause, workflows.SignalResume, workflows.SignalSkip, workflows.SignalAbort}

// SignalAnswer is the answer of POST /console/api/curricula/{curriculum}/signal/{signal}.
type SignalAnswer struct {
	Curriculum string `json:"curriculum"`
	Signal     string `json:"signal"`
	Sent       bool   `json:"sent"`
}

// authorize checks the request's bearer token against the env API's tokens.
func (c *Console) authorize(r *http.Request) error {
	if c.cfg.Authorize == nil {
		return fmt.Errorf("%w: this console takes no actions (it was started without the env API's tokens)", errReadOnly)
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || strings.TrimSpace(tok) == "" {
		return fmt.Errorf("%w: actions need an env API token (Authorization: Bearer <token>)", errUnauthorized)
	}
	if !c.cfg.Authorize(strings.TrimSpace(tok)) {
		return fmt.Errorf("%w: unknown API token", errUnauthorized)
	}
	return nil
}

// signal sends a curriculum one of its signals, as `gauntlet curriculum pause` does.
// The token is checked before Temporal is asked anything, and the workflow must be an
// open curriculum.
func (c *Console) signal(ctx context.Context, r *http.Request, _ params) (any, error) {
	id, sig := r.PathValue("curriculum"), r.PathValue("signal")
	if !slices.Contains(consoleSignals, sig) {
		return nil, fmt.Errorf("%w: signal %q: want one of %s", errBadRequest, sig, strings.Join(consoleSignals, ", "))
	}
	if err := c.authorize(r); err != nil {
		return nil, err
	}
	tc, err := c.temporalClient(ctx)
	if err != nil {
		return nil, err
	}
	info, err := c.describeCurriculum(ctx, tc, id)
	if err != nil {
		return nil, err
	}
	if info.GetStatus() != enums.WORKFLOW_EXECUTION_STATUS_RUNNING {
		return nil, fmt.Errorf("%w: curriculum %s has closed (%s)", errConflict, id, summaryOf(info).State)
	}
	if err := tc.SignalWorkflow(ctx, id, "", sig, nil); err != nil {
		return nil, fmt.Errorf("%s curriculum %s: %w", sig, id, err)
	}
	c.log.Info("console: curriculum signalled", "curriculum", id, "signal", sig, "from", r.RemoteAddr)
	return SignalAnswer{Curriculum: id, Signal: sig, Sent: true}, nil
}

// errConflict is an action on something in a state that refuses it (409).
var errConflict = errors.New("conflict")
