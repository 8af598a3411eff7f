package ctrd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/gauntlet-rl/gauntlet/pkg/images"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// Task images.
//
// A sandbox may run any image containerd holds, not only the base image: a task's
// image, built or pulled by PrepareImage. Such an image does not carry the agent, so
// the runtime shows its own copy (agentDir) read-only at /.gauntlet, where the base
// image keeps it; and it may lack /workspace, which makeLinks creates.
//
// Links (Spec.Links, Harbor's /app, /logs, /tests) are made in a new sandbox's root
// once its task runs: what the image holds at a link's path (a task image's /app, put
// there by its Dockerfile) moves into the workspace folder the link leads to, and the
// path becomes a symlink to that folder. The root's changes live in the sandbox's
// writable layer, so forks and restores inherit them and makeLinks runs only on the
// image. The host reaches the container's root through /proc/PID/root with os.Root,
// which refuses to follow a link out of it: an image cannot lead these writes onto
// the host.
//
// A snapshot of a sandbox with links keeps its workspace and the links only, not what
// the sandbox wrote elsewhere in its root (a program dropped into /usr/local/bin, a
// changed /etc): a snapshot is of the workspace, as the Snapshotter contract says, and a
// fork that judges an agent's work (a task's verifier) starts from the image plus that
// workspace, exactly as on the process runtime, whose root outside the workspace is
// read-only.

// agentMount is where a task image's sandboxes see the runtime's agent (agentDir).
const agentMount = "/.gauntlet"

// installAgent copies the agent binary into the state directory, which task images'
// sandboxes bind read-only at agentMount, so they run the agent this runtime was
// started with even when the file it was given changes later.
func installAgent(stateDir, bin string) (string, error) {
	dir := filepath.Join(stateDir, "agent")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("install agent: %w", err)
	}
	dst := filepath.Join(dir, path.Base(AgentPath))
	in, err := os.Open(bin)
	if err != nil {
		return "", fmt.Errorf("install agent: %w", err)
	}
	defer in.Close()
	tmp, err := os.CreateTemp(dir, ".agent-*")
	if err != nil {
		return "", fmt.Errorf("install agent: %w", err)
	}
	_, err = io.Copy(tmp, in)
	err = errors.Join(err, tmp.Chmod(0o755), tmp.Close())
	if err == nil {
		err = os.Rename(tmp.Name(), dst)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return "", fmt.Errorf("install agent: %w", err)
	}
	return dir, nil
}

// PrepareImage implements sandbox.ImagePreparer: it builds the source's context (or
// resolves its reference) with the runtime's image store, pulls the image into
// containerd and unpacks it, and returns the name Spec.Image takes. An image already
// built and pulled costs a registry lookup.
func (r *Runtime) PrepareImage(ctx context.Context, src sandbox.ImageSource) (string, error) {
	if r.isClosed() {
		return "", fmt.Errorf("prepare image: %w", sandbox.ErrClosed)
	}
	if r.opts.Images == nil {
		return "", fmt.Errorf("prepare image: %w: the containerd runtime was made without an image store (Options.Images)", sandbox.ErrUnavailable)
	}
	ctx = r.ctx(ctx)
	img, err := r.opts.Images.Prepare(ctx, images.Source{Context: src.Context, Dockerfile: src.Dockerfile, Image: src.Image, Repository: src.Repository})
	if err != nil {
		return "", fmt.Errorf("prepare image: %w", err)
	}
	cimg, err := r.opts.Images.Pull(ctx, r.c, img, r.opts.Snapshotter)
	if err != nil {
		return "", fmt.Errorf("prepare image: %w", err)
	}
	return cimg.Name(), nil
}

// ImageConfig implements sandbox.ImageInspector for an image PrepareImage returned (or
// any image containerd holds).
func (r *Runtime) ImageConfig(ctx context.Context, image string) (sandbox.ImageConfig, error) {
	img, err := r.c.GetImage(r.ctx(ctx), image)
	if err != nil {
		return sandbox.ImageConfig{}, fmt.Errorf("image config %s: %w", image, err)
	}
	cfg, err := img.Spec(r.ctx(ctx))
	if err != nil {
		return sandbox.ImageConfig{}, fmt.Errorf("image config %s: %w", image, err)
	}
	return sandbox.ImageConfig{User: cfg.Config.User, WorkingDir: cfg.Config.WorkingDir}, nil
}

// makeLinks makes a new sandbox's workspace folder and the spec's links in its root
// (see the comment at the top of this file).
func (r *Runtime) makeLinks(b *box) error {
	links := b.handle.Spec.Links
	if b.handle.Spec.Image == BaseImage && len(links) == 0 && b.user.UID == 0 && b.user.GID == 0 {
		return nil // the base image has its /workspace, root's
	}
	root, err := os.OpenRoot(fmt.Sprintf("/proc/%d/root", b.task.Pid()))
	if err != nil {
		return fmt.Errorf("links: open the sandbox's root: %w", err)
	}
	defer root.Close()
	ws := strings.TrimPrefix(sandbox.WorkspacePath, "/")
	if err := root.MkdirAll(ws, 0o755); err != nil {
		return fmt.Errorf("links: make %s: %w", sandbox.WorkspacePath, err)
	}
	// The workspace and the folders made for links (not those the image filled, whose
	// owners are the image's) are the sandbox user's, as the runtime's own folders of a
	// root sandbox are root's: the verifier, run as that user, clears /logs/verifier.
	give := func(name string) error {
		if b.user.UID == 0 && b.user.GID == 0 {
			return nil
		}
		return root.Lchown(name, int(b.user.UID), int(b.user.GID))
	}
	if err := give(ws); err != nil {
		return fmt.Errorf("links: %s: %w", sandbox.WorkspacePath, err)
	}
	for _, l := range slices.Sorted(maps.Keys(links)) {
		name := strings.TrimPrefix(l, "/")
		rel, _ := sandbox.CleanRelPath(links[l]) // validated
		dst := path.Join(ws, rel)
		fi, err := root.Lstat(name)
		switch {
		case err == nil && fi.IsDir():
			if err := sandbox.CopyTree(root, name, root, dst, fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky, imageOwner); err != nil {
				return fmt.Errorf("links: move the image's %s into the workspace: %w", l, err)
			}
			if err := root.RemoveAll(name); err != nil {
				return fmt.Errorf("links: %s: %w", l, err)
			}
		case err == nil:
			return fmt.Errorf("%w: links: the image holds %s, which is not a folder (%v)", sandbox.ErrInvalid, l, fi.Mode().Type())
		case !errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("links: %s: %w", l, err)
		}
		if err := root.MkdirAll(dst, 0o755); err != nil {
			return fmt.Errorf("links: make %s: %w", dst, err)
		}
		if fi == nil {
			if err := give(dst); err != nil {
				return fmt.Errorf("links: %s: %w", dst, err)
			}
		}
		if err := root.Symlink(path.Join(sandbox.WorkspacePath, rel), name); err != nil {
			return fmt.Errorf("links: %s: %w", l, err)
		}
	}
	return nil
}

// imageOwner keeps a copied file's owner: the image's own.
func imageOwner(fi fs.FileInfo) (uid, gid int) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid), int(st.Gid)
	}
	return -1, -1 // unchanged
}

// snapshotKeeps is what a snapshot of the sandbox copies of its writable layer: every
// top-level entry (nil), or for a sandbox with links only the workspace and the links.
func snapshotKeeps(spec sandbox.Spec) func(top string) bool {
	if len(spec.Links) == 0 {
		return nil
	}
	ws := strings.TrimPrefix(sandbox.WorkspacePath, "/")
	return func(top string) bool {
		if top == ws {
			return true
		}
		_, ok := spec.Links["/"+top]
		return ok
	}
}
