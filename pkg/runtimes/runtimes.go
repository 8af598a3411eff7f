// Package runtimes opens a sandbox runtime by name (process, containerd) and lends its
// sandboxes to envs as an env.Sandboxes. Each runtime is one Registration row, registered
// from its own file of the package (process.go, containerd.go). Workers use it for --sandbox.runtime; the CLI's
// episode snapshot and fork use it to rebuild episodes locally.
//
// The returned Sandboxes is safe for concurrent use; whoever opened it closes its runtime.
package runtimes

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc"
	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/pool"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
)

// None is the Config.Runtime of no runtime; the registered rows name the others
// (Process, Containerd).
const None = ""

// Config chooses the sandbox runtime that envs needing real sandboxes (codefix) run in.
// Pure envs (shop) never touch it.
type Config struct {
	// Runtime is "process", "containerd", or empty for none (such envs' episodes then
	// fail with env.ErrNoSandbox).
	Runtime string
	// Image is the root filesystem sandboxes get when an env does not name one: for
	// containerd an image reference, for process "" or "host".
	Image string
	// StateDir is where the runtime keeps its state (sandboxes survive a worker restart
	// there).
	StateDir string
	// Containerd is the socket of a running containerd (scripts/containerd.sh start
	// prints it); empty starts a private one under StateDir, stopped by Close.
	Containerd string
	// AgentBinary is the static in-sandbox agent for the containerd base image; empty
	// builds it from source with the Go toolchain.
	AgentBinary string
	// PoolSize is how many warm sandboxes to keep per template of the registered envs
	// (env.SandboxTemplater); 0 creates every sandbox on demand.
	PoolSize int
	// ImagePools bounds the warm pools of task images (one per image, made as the image
	// is first met): 0 means DefaultImagePools. When all are taken, the pool of the image
	// least lately asked for gives way to a new image's once it has gone ImagePoolIdle
	// without an episode; until then new images get sandboxes made on demand.
	ImagePools int
	// ImagePoolIdle is how long an image's pool goes without an episode before a new
	// image may take its place; 0 means DefaultImagePoolIdle.
	ImagePoolIdle time.Duration
	// Images configures the image store of runtimes that build and pull task images
	// (sandbox.ImagePreparer: containerd).
	Images ImagesConfig
	// Hosts says where the host process reaches the hosts a task may allow
	// (sandbox.HostMapper): NAME=HOST:PORT (NAME's port 80) or NAME:PORT=HOST:PORT; a
	// port not in it is reached at the host's own name, through the host's resolver.
	Hosts HostsFlag
}

// ImagesConfig is where task images are built, kept and pulled from (package images).
type ImagesConfig struct {
	// Registry is the registry (host[:port]) built images are pushed to and found in;
	// empty: tasks that bring a Dockerfile cannot run (those naming an image can).
	Registry string
	// DockerHubMirror is asked first for Docker Hub images (FROM debian:bookworm-slim);
	// offline, the local registry the base image was pushed to.
	DockerHubMirror string
	// CacheDir holds the builder's storage and logs; empty: the user's cache directory.
	CacheDir string
}

// Validate reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	if c.Runtime != None {
		if r, err := registered.Lookup(c.Runtime); err != nil {
			errs = append(errs, unknownRuntime(c.Runtime))
		} else if r.Validate != nil {
			errs = append(errs, r.Validate(c)...)
		}
	}
	if c.PoolSize < 0 || c.PoolSize > 1024 {
		errs = append(errs, fmt.Errorf("sandbox.pool-size: %d must be between 0 and 1024", c.PoolSize))
	}
	if c.ImagePools < 0 || c.ImagePools > 4096 {
		errs = append(errs, fmt.Errorf("sandbox.image-pools: %d must be between 0 (the default, %d) and 4096", c.ImagePools, DefaultImagePools))
	}
	if c.ImagePoolIdle < 0 {
		errs = append(errs, fmt.Errorf("sandbox.image-pool-idle: %v must not be negative", c.ImagePoolIdle))
	}
	if c.Runtime != None && c.StateDir == "" {
		errs = append(errs, errors.New("sandbox.state-dir: must be set when sandbox.runtime is"))
	}
	return errors.Join(errs...)
}

// Sandboxes lends sandboxes from a runtime (env.Sandboxes): from a warm pool (package
// pool) when the spec matches one of its templates, otherwise created on demand. Release
// resets pooled sandboxes for the next episode and destroys the others (forks among them).
// It owns the runtime, the pool and whatever the runtime needed started (a containerd
// daemon); Close releases them.
type Sandboxes struct {
	rt      sandbox.Runtime
	image   string
	pool    *pool.Pool
	size    int                   // the pool's size per template (Config.PoolSize)
	closers []func() error        // run after the runtime's Close, in order
	sup     *childproc.Supervisor // the row's Opened.Supervisor; nil when it has none
	log     *slog.Logger

	mu     sync.Mutex
	leases map[string]*pool.Lease
	// tpl are the pool's templates by name: the envs' own, and one per image of its own
	// (a task's) that a spec named, made as it was first acquired (template).
	tpl map[string]sandbox.Spec
	// imageUsed is when each template of the latter kind last served an acquire: the
	// one least lately used gives way to a new image's once idle long enough.
	imageUsed  map[string]time.Time
	imagePools int           // Config.ImagePools, defaulted
	imageIdle  time.Duration // Config.ImagePoolIdle, defaulted
	now        func() time.Time
}

// Defaults of the task images' warm pools (Config.ImagePools, Config.ImagePoolIdle).
// Each pool keeps Config.PoolSize sandboxes warm. A curriculum moving from one set of
// tasks to the next frees the last set's pools a minute after its last episode; a
// dataset of more images than pools, drawn from at random, keeps the first ones warm
// and makes the rest on demand rather than making and destroying pools for every draw.
const (
	DefaultImagePools    = 32
	DefaultImagePoolIdle = time.Minute
)

var _ env.Sandboxes = (*Sandboxes)(nil)

// Ready is nil while the runtime can make sandboxes as far as this process can tell,
// else why it cannot: the private containerd it started died and is being restarted.
func (s *Sandboxes) Ready() error {
	if s.sup == nil {
		return nil
	}
	return s.sup.Ready()
}

// Supervisor is the supervisor of the private daemon the runtime started (containerd
// without Config.Containerd); nil when it started none. It does not run by itself: a
// long-lived owner (the gauntlet process's sandbox module) runs it, so the daemon is
// restarted when it dies, until the owner stops.
func (s *Sandboxes) Supervisor() *childproc.Supervisor { return s.sup }

// Runtime is the runtime the sandboxes come from.
func (s *Sandboxes) Runtime() sandbox.Runtime { return s.rt }

// Acquire returns a sandbox made from spec, with Config.Image when spec names none: a warm
// one of the pool, its workspace filled with spec.Workspace, when spec matches a template
// (an env's, or the one its own image got: imageTemplate); otherwise a new one.
func (s *Sandboxes) Acquire(ctx context.Context, spec sandbox.Spec) (sandbox.Handle, error) {
	if spec.Image == "" {
		spec.Image = s.image
	}
	if s.pool != nil {
		if name, ok := s.template(spec); ok {
			return s.acquireWarm(ctx, name, spec)
		}
	}
	return s.rt.Create(ctx, spec)
}

// template is the pool's template that can serve spec, if any: the env's template it
// names, or for a spec on an image of its own (a task's, which no env's template can
// know) the template of that image, added to the pool the first time (that acquire is a
// miss; the pool keeps the next ones warm), up to MaxImageTemplates.
func (s *Sandboxes) template(spec sandbox.Spec) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.tpl[spec.Template]; ok && sameShape(t, spec) {
		return spec.Template, true
	}
	if spec.Template == "" || spec.Image == "" || spec.Image == s.image {
		return "", false
	}
	name := spec.Template + "@" + spec.Image
	now := s.now()
	if t, ok := s.tpl[name]; ok {
		s.imageUsed[name] = now
		return name, sameShape(t, spec)
	}
	if len(s.imageUsed) >= s.imagePools && !s.evictIdleImage(now) {
		return "", false
	}
	t := spec
	t.ID, t.Workspace, t.Labels = "", nil, nil
	if err := s.pool.AddTemplate(pool.Template{Name: name, Spec: t, Size: s.size}); err != nil {
		s.log.Warn("no warm pool for an image", "template", name, "err", err)
		return "", false
	}
	s.tpl[name] = t
	s.imageUsed[name] = now
	return name, true
}

// evictIdleImage takes out of the pool the image template least lately used, if it has
// been idle for s.imageIdle, and reports whether it did. Its sandboxes are destroyed in
// the background: those leased go on until released. s.mu is held.
func (s *Sandboxes) evictIdleImage(now time.Time) bool {
	victim, last := "", now
	for name, used := range s.imageUsed {
		if used.Before(last) {
			victim, last = name, used
		}
	}
	if victim == "" || now.Sub(last) < s.imageIdle {
		return false
	}
	delete(s.tpl, victim)
	delete(s.imageUsed, victim)
	s.log.Info("image pool given way to a new image", "template", victim, "idle", now.Sub(last).Round(time.Second))
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.pool.RemoveTemplate(ctx, victim); err != nil {
			s.log.Warn("remove an image's pool", "template", victim, "err", err)
		}
	}()
	return true
}

func (s *Sandboxes) acquireWarm(ctx context.Context, template string, spec sandbox.Spec) (sandbox.Handle, error) {
	l, err := s.pool.Acquire(ctx, template)
	if err != nil {
		return sandbox.Handle{}, err
	}
	tb := tools.New(s.rt, l.Handle.ID, tools.Options{MaxFileBytes: 64 << 20})
	for _, f := range spec.Workspace {
		if err := tb.Write(ctx, f.Path, f.Data, uint32(f.Mode)); err != nil {
			return sandbox.Handle{}, errors.Join(fmt.Errorf("seed workspace of %s: %w", l.Handle.ID, err), l.Discard(ctx))
		}
	}
	s.mu.Lock()
	s.leases[l.Handle.ID] = l
	s.mu.Unlock()
	return l.Handle, nil
}

// sameShape reports whether a sandbox of template t can serve spec: everything but the
// workspace and labels is the same (services and links too: they shape its network and
// root; the user, who its commands run as).
func sameShape(t, spec sandbox.Spec) bool {
	t, spec = t.WithDefaults(), spec.WithDefaults()
	return t.Image == spec.Image && t.User == spec.User && t.Limits == spec.Limits && t.Network == spec.Network && slices.Equal(t.Env, spec.Env) &&
		slices.EqualFunc(t.Services, spec.Services, sameService) && maps.Equal(t.Links, spec.Links)
}

// sameService reports whether two services are the same, allowed hosts and their ports
// included.
func sameService(a, b sandbox.Service) bool {
	return a.Name == b.Name && a.Port == b.Port && a.Upstream == b.Upstream && a.Protocol == b.Protocol &&
		slices.Equal(a.Hosts, b.Hosts) && slices.Equal(a.TLSPorts, b.TLSPorts) && slices.Equal(a.TCPPorts, b.TCPPorts)
}

// Release gives a sandbox back: a pooled one is reset for the next episode, any other is
// destroyed.
func (s *Sandboxes) Release(ctx context.Context, id string) error {
	s.mu.Lock()
	l, ok := s.leases[id]
	delete(s.leases, id)
	s.mu.Unlock()
	if ok {
		return l.Release(ctx)
	}
	return s.rt.Destroy(ctx, id)
}

// Close stops the pool, destroys the sandboxes still out (the modules that lent them
// have stopped, and the next Open would only destroy them: left running they would hold
// their processes, cgroups and memory until then, or for good when no Open follows),
// closes the runtime and stops what Open started for it.
func (s *Sandboxes) Close() error {
	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if s.pool != nil {
		errs = append(errs, s.pool.Stop(ctx))
	}
	errs = append(errs, s.destroyAll(ctx, "destroyed a sandbox still out at close"))
	errs = append(errs, s.rt.Close())
	for _, c := range s.closers {
		errs = append(errs, c())
	}
	return errors.Join(errs...)
}

// Open opens the configured runtime, destroys the sandboxes an earlier process left in its
// state directory, and starts a warm pool when c.PoolSize asks for one; it returns nil
// when c names no runtime. One process at a time may use a state directory. The caller
// closes the result.
func Open(ctx context.Context, c Config, log *slog.Logger) (*Sandboxes, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.Runtime == None {
		return nil, nil
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Sandboxes{image: c.Image, size: c.PoolSize, tpl: map[string]sandbox.Spec{}, leases: map[string]*pool.Lease{}, log: log,
		imageUsed: map[string]time.Time{}, imagePools: cmp.Or(c.ImagePools, DefaultImagePools), imageIdle: cmp.Or(c.ImagePoolIdle, DefaultImagePoolIdle), now: time.Now}
	r, _ := registered.Lookup(c.Runtime) // Validate found it
	o, err := r.Open(ctx, c, filepath.Clean(c.StateDir), log)
	if err != nil {
		return nil, fmt.Errorf("sandbox.runtime %s: %w", c.Runtime, err)
	}
	s.rt, s.sup = o.Runtime, o.Supervisor
	if o.Stop != nil {
		s.closers = append(s.closers, o.Stop)
	}
	if err := s.reapLeftovers(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("sandbox.runtime %s: %w", c.Runtime, err), s.Close())
	}
	if c.PoolSize > 0 {
		if err := s.openPool(ctx, c, log); err != nil {
			return nil, errors.Join(fmt.Errorf("sandbox.pool-size %d: %w", c.PoolSize, err), s.Close())
		}
	}
	return s, nil
}

// reapLeftovers destroys the sandboxes and snapshots a previous process left in the state directory (a
// worker that crashed mid-episode): their episodes are redelivered and start again from
// their seed in new sandboxes, so nothing in the old ones is needed.
func (s *Sandboxes) reapLeftovers(ctx context.Context) error {
	return s.destroyAll(ctx, "destroyed a sandbox left by an earlier process")
}

// destroyAll destroys every sandbox the runtime lists, logging each with msg. A failed
// Destroy is logged and skipped; a failed List is the error.
func (s *Sandboxes) destroyAll(ctx context.Context, msg string) error {
	hs, err := s.rt.List(ctx)
	if err != nil {
		return fmt.Errorf("list sandboxes to destroy: %w", err)
	}
	log := s.log
	for _, h := range hs {
		err := s.rt.Destroy(ctx, h.ID)
		switch {
		case errors.Is(err, sandbox.ErrNotFound):
			log.Info("a listed sandbox was already gone", "sandbox", h.ID)
		case err != nil:
			log.Warn("destroy sandbox", "sandbox", h.ID, "err", err)
		default:
			log.Info(msg, "sandbox", h.ID)
		}
	}
	// Their snapshots (a warm pool's template, an episode's branch point) are of no more
	// use either; left, each restart after a crash would add one.
	l, ok := s.rt.(sandbox.SnapshotLister)
	if !ok {
		return nil
	}
	snaps, err := l.ListSnapshots(ctx)
	if err != nil {
		return fmt.Errorf("list leftover snapshots: %w", err)
	}
	del := s.rt.(sandbox.Snapshotter) // a SnapshotLister is one
	for _, sn := range snaps {
		if err := del.DeleteSnapshot(ctx, sn.ID); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
			log.Warn("delete leftover snapshot", "snapshot", sn.ID, "err", err)
			continue
		}
		log.Info("deleted a snapshot left by an earlier process", "snapshot", sn.ID)
	}
	return nil
}

// openPool starts a warm pool of every template the registered envs declare.
func (s *Sandboxes) openPool(ctx context.Context, c Config, log *slog.Logger) error {
	var tpls []pool.Template
	for _, name := range env.Names() {
		e, err := env.Lookup(name)
		if err != nil {
			continue
		}
		st, ok := e.(env.SandboxTemplater)
		if !ok {
			continue
		}
		for _, spec := range st.SandboxTemplates() {
			if spec.Image == "" {
				spec.Image = c.Image
			}
			if _, dup := s.tpl[spec.Template]; dup {
				continue
			}
			s.tpl[spec.Template] = spec
			tpls = append(tpls, pool.Template{Name: spec.Template, Spec: spec, Size: c.PoolSize})
		}
	}
	if len(tpls) == 0 {
		return nil
	}
	p, err := pool.New(pool.Config{Runtime: s.rt, Templates: tpls, LeaseTTL: leaseTTL, Logger: log})
	if err != nil {
		return err
	}
	// The pool outlives Open's ctx (a module's Starting context); Close stops it.
	if err := p.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	s.pool = p
	return nil
}

// leaseTTL is how long an episode may hold a pooled sandbox before the pool's reaper
// takes it back (an episode that leaked it).
const leaseTTL = time.Hour
