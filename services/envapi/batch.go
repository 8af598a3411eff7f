package envapi

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// maxBatch caps the steps of one batch call.
const maxBatch = 4096

// inbox is one result queue of a tenant: completed results nobody has collected yet
// (Send, and what StepBatch or StepStream did not return), for Recv naming the queue. changed is closed and replaced on
// every change, so any number of waiters wake.
type inbox struct {
	mu       sync.Mutex
	results  []*gauntletv1.StepResult
	inflight int
	changed  chan struct{}
	used     time.Time // last call naming the queue, for the reaper (guarded by Service.mu)
}

// idle reports whether the queue holds nothing and expects nothing.
func (b *inbox) idle() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.inflight == 0 && len(b.results) == 0
}

func newInbox() *inbox { return &inbox{changed: make(chan struct{})} }

func (b *inbox) signalLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
}

func (b *inbox) pending() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.inflight + len(b.results)
}

// wait returns between min and max ready results (max 0: all ready), or fewer when
// timeout or ctx ends first.
func (b *inbox) wait(ctx context.Context, minN, maxN int, timeout time.Duration) []*gauntletv1.StepResult {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		b.mu.Lock()
		ch := b.changed
		if len(b.results) >= minN {
			break
		}
		b.mu.Unlock()
		select {
		case <-ch:
		case <-timer.C:
			b.mu.Lock()
			goto take
		case <-ctx.Done():
			b.mu.Lock()
			goto take
		}
	}
take:
	n := len(b.results)
	if maxN > 0 && n > maxN {
		n = maxN
	}
	out := append([]*gauntletv1.StepResult(nil), b.results[:n]...)
	b.results = append(b.results[:0], b.results[n:]...)
	b.mu.Unlock()
	return out
}

// collector gathers the results of one StepBatch or StepStream call until the call lets
// go of them (handOff); results that complete after that go to the tenant's inbox.
type collector struct {
	box     *inbox
	mu      sync.Mutex
	results []*gauntletv1.StepResult
	handed  bool
	changed chan struct{}
}

func (c *collector) put(r *gauntletv1.StepResult) {
	c.mu.Lock()
	if !c.handed {
		c.results = append(c.results, r)
		close(c.changed)
		c.changed = make(chan struct{})
		c.mu.Unlock()
		c.box.mu.Lock()
		c.box.inflight--
		c.box.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.box.mu.Lock()
	c.box.inflight--
	c.box.results = append(c.box.results, r)
	c.box.signalLocked()
	c.box.mu.Unlock()
}

// take returns the results gathered so far and the channel closed at the next one.
func (c *collector) take() ([]*gauntletv1.StepResult, chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.results
	c.results = nil
	return out, c.changed
}

// handOff sends every later result to the inbox and returns those gathered meanwhile.
func (c *collector) handOff() []*gauntletv1.StepResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.handed = true
	out := c.results
	c.results = nil
	return out
}

// maxQueueName bounds a result queue's name.
const maxQueueName = 128

// inbox returns the tenant's result queue of that name.
func (s *Service) inbox(tenant, queue string) (*inbox, error) {
	if len(queue) > maxQueueName {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("queue: %d bytes is longer than %d", len(queue), maxQueueName))
	}
	key := tenant + "\x00" + queue
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.inboxes[key]
	if !ok {
		b = newInbox()
		s.inboxes[key] = b
	}
	b.used = time.Now()
	return b, nil
}

// launch starts every step of reqs in the background (they outlive the call that sent
// them) and hands each result, or its per-item error, to sink.
func (s *Service) launch(t *Tenant, box *inbox, reqs []*gauntletv1.StepRequest, sink func(*gauntletv1.StepResult)) error {
	if len(reqs) == 0 {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("steps: at least one step is required"))
	}
	if len(reqs) > maxBatch {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("steps: %d steps is more than %d per call", len(reqs), maxBatch))
	}
	box.mu.Lock()
	if held := box.inflight + len(box.results); held+len(reqs) > 4*s.quota(t)+maxBatch {
		box.mu.Unlock()
		return overQuota(fmt.Sprintf("tenant %s has %d results in flight or waiting for Recv; collect them first", t.Name, held))
	}
	box.inflight += len(reqs)
	box.mu.Unlock()
	for _, r := range reqs {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			res, err := s.step(s.ctx, t, r)
			if err != nil {
				res = &gauntletv1.StepResult{EpisodeId: r.GetEpisodeId(), Error: stepError(err)}
			}
			sink(res)
		}()
	}
	return nil
}

func stepError(err error) *gauntletv1.StepError {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return &gauntletv1.StepError{Code: ce.Code().String(), Message: ce.Message()}
	}
	return &gauntletv1.StepError{Code: connect.CodeInternal.String(), Message: err.Error()}
}

// StepBatch steps many episodes and returns once min_results are done.
func (s *Service) StepBatch(ctx context.Context, req *connect.Request[gauntletv1.StepBatchRequest]) (*connect.Response[gauntletv1.StepBatchResponse], error) {
	t := tenantOf(ctx)
	box, err := s.inbox(t.Name, req.Msg.GetQueue())
	if err != nil {
		return nil, err
	}
	c := &collector{box: box, changed: make(chan struct{})}
	n := len(req.Msg.GetSteps())
	if err := s.launch(t, box, req.Msg.GetSteps(), c.put); err != nil {
		return nil, err
	}
	want := int(req.Msg.GetMinResults())
	if want == 0 || want > n {
		want = n
	}
	timeout := s.cfg.StepTimeout
	if ms := req.Msg.GetTimeoutMs(); ms > 0 {
		timeout = time.Duration(ms) * time.Millisecond
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var out []*gauntletv1.StepResult
wait:
	for len(out) < want {
		got, changed := c.take()
		out = append(out, got...)
		if len(out) >= want {
			break
		}
		select {
		case <-changed:
		case <-timer.C:
			break wait
		case <-ctx.Done():
			break wait
		}
	}
	out = append(out, c.handOff()...)
	return connect.NewResponse(&gauntletv1.StepBatchResponse{Results: out, Pending: uint32(box.pending())}), nil
}

// Send queues steps; their results wait for Recv.
func (s *Service) Send(ctx context.Context, req *connect.Request[gauntletv1.StepBatchRequest]) (*connect.Response[gauntletv1.SendResponse], error) {
	t := tenantOf(ctx)
	box, err := s.inbox(t.Name, req.Msg.GetQueue())
	if err != nil {
		return nil, err
	}
	c := &collector{box: box, handed: true}
	if err := s.launch(t, box, req.Msg.GetSteps(), c.put); err != nil {
		return nil, err
	}
	return connect.NewResponse(&gauntletv1.SendResponse{Accepted: uint32(len(req.Msg.GetSteps()))}), nil
}

// Recv returns completed results of earlier calls.
func (s *Service) Recv(ctx context.Context, req *connect.Request[gauntletv1.RecvRequest]) (*connect.Response[gauntletv1.StepBatchResponse], error) {
	box, err := s.inbox(tenantOf(ctx).Name, req.Msg.GetQueue())
	if err != nil {
		return nil, err
	}
	minN := max(int(req.Msg.GetMinResults()), 1)
	timeout := 10 * time.Second
	if ms := req.Msg.GetTimeoutMs(); ms > 0 {
		timeout = time.Duration(ms) * time.Millisecond
	}
	out := box.wait(ctx, minN, int(req.Msg.GetMaxResults()), timeout)
	return connect.NewResponse(&gauntletv1.StepBatchResponse{Results: out, Pending: uint32(box.pending())}), nil
}

// StepStream steps many episodes and streams each result as it completes. Results not
// sent when the stream breaks go to the inbox.
func (s *Service) StepStream(ctx context.Context, req *connect.Request[gauntletv1.StepBatchRequest], stream *connect.ServerStream[gauntletv1.StepResult]) error {
	t := tenantOf(ctx)
	box, err := s.inbox(t.Name, req.Msg.GetQueue())
	if err != nil {
		return err
	}
	c := &collector{box: box, changed: make(chan struct{})}
	n := len(req.Msg.GetSteps())
	if err := s.launch(t, box, req.Msg.GetSteps(), c.put); err != nil {
		return err
	}
	for sent := 0; sent < n; {
		got, changed := c.take()
		for i, r := range got {
			if err := stream.Send(r); err != nil {
				box.mu.Lock()
				box.results = append(box.results, got[i:]...)
				box.results = append(box.results, c.handOff()...)
				box.signalLocked()
				box.mu.Unlock()
				return err
			}
			sent++
		}
		if sent >= n {
			break
		}
		select {
		case <-changed:
		case <-ctx.Done():
			rest := c.handOff()
			box.mu.Lock()
			box.results = append(box.results, rest...)
			box.signalLocked()
			box.mu.Unlock()
			return ctx.Err()
		}
	}
	return nil
}
