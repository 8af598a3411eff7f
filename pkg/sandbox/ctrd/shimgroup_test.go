package ctrd

import (
	"testing"
	"time"
)

func newGroups(max int) *shimGroups {
	s := &shimGroups{}
	s.init("k", max)
	return s
}

func TestShimGroupsFillUpToTheCap(t *testing.T) {
	s := newGroups(3)
	var ids []string
	for range 4 {
		g := s.join(0)
		s.created(g, true)
		ids = append(ids, g.id)
	}
	if ids[0] != ids[1] || ids[1] != ids[2] {
		t.Fatalf("the first three sandboxes should share a shim: %v", ids)
	}
	if ids[3] == ids[0] {
		t.Fatalf("the fourth sandbox joined a full group: %v", ids)
	}
}

func TestShimGroupsOneEachWhenMaxIsOne(t *testing.T) {
	s := newGroups(1)
	a := s.join(0)
	s.created(a, true)
	b := s.join(0)
	s.created(b, true)
	if a.id == b.id {
		t.Fatalf("SandboxesPerShim 1 shared a shim: %s", a.id)
	}
}

func TestShimGroupsAreNeverRejoinedOnceEmpty(t *testing.T) {
	s := newGroups(8)
	a := s.join(0)
	s.created(a, true)
	s.leave(a.id) // its last task: the shim exits
	b := s.join(0)
	s.created(b, true)
	if a.id == b.id {
		t.Fatalf("a new sandbox joined group %s after its last task was deleted", a.id)
	}
	if _, ok := s.byID[a.id]; ok {
		t.Fatalf("empty sealed group %s is still tracked", a.id)
	}
}

func TestShimGroupsFailedCreateSeals(t *testing.T) {
	s := newGroups(8)
	a := s.join(0)
	s.created(a, true)
	f := s.join(0)
	s.created(f, false)
	if f.id != a.id || !a.sealed {
		t.Fatalf("a failed creation should seal its group (sealed=%v)", a.sealed)
	}
	b := s.join(0)
	if b.id == a.id {
		t.Fatal("a sandbox joined a sealed group")
	}
	s.created(b, true)
	s.leave(a.id)
	if _, ok := s.byID[a.id]; ok {
		t.Fatal("sealed group not forgotten after its last task left")
	}
}

func TestShimGroupsLastLeaveWaitsForPendingCreates(t *testing.T) {
	s := newGroups(8)
	a := s.join(0)
	s.created(a, true)
	p := s.join(0) // a task being created in the same shim
	if p.id != a.id {
		t.Fatal("expected the same group")
	}
	left := make(chan struct{})
	go func() {
		s.leave(a.id)
		close(left)
	}()
	select {
	case <-left:
		t.Fatal("the group's last task left while another was being created in its shim")
	case <-time.After(50 * time.Millisecond):
	}
	s.created(p, true)
	select {
	case <-left:
	case <-time.After(5 * time.Second):
		t.Fatal("leave did not return after the pending creation ended")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.sealed || p.live != 1 {
		t.Fatalf("group should stay open with one live task: sealed=%v live=%d", p.sealed, p.live)
	}
}

// A task of a group the tracker never made (recovered from an earlier runtime) or of no
// group leaving changes nothing: leave returns at once, no group appears, and the next
// sandbox still gets a group of its own that fills as usual.
func TestShimGroupsIgnoreUnknownGroups(t *testing.T) {
	s := newGroups(2)
	a := s.join(0)
	s.created(a, true)
	left := make(chan struct{})
	go func() {
		s.leave("recovered-from-an-earlier-runtime")
		s.leave("")
		close(left)
	}()
	select {
	case <-left:
	case <-time.After(5 * time.Second):
		t.Fatal("leave of an unknown group blocked")
	}
	s.mu.Lock()
	groups, live := len(s.byID), a.live
	s.mu.Unlock()
	if groups != 1 || live != 1 {
		t.Fatalf("after unknown groups left: %d groups tracked, the known one with %d live tasks; want 1 and 1", groups, live)
	}
	b := s.join(0)
	s.created(b, true)
	if b.id != a.id {
		t.Fatalf("the second sandbox got group %s, want the open group %s", b.id, a.id)
	}
}

// A group whose shim started in another mount namespace (a daemon restarted since) is not
// joined: the new sandbox's disk quota is mounted where its shim will mount its rootfs.
func TestShimGroupsStayInTheirNamespace(t *testing.T) {
	s := newGroups(8)
	a := s.join(1)
	s.created(a, true)
	b := s.join(2)
	s.created(b, true)
	c := s.join(2)
	s.created(c, true)
	if a.id == b.id || b.id != c.id {
		t.Fatalf("groups %s (namespace 1), %s and %s (namespace 2): want the first alone, the others shared", a.id, b.id, c.id)
	}
}
