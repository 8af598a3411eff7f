package process

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/moby/sys/user"
	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"

	"github.com/gauntlet-rl/gauntlet/pkg/images"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// Image roots.
//
// A sandbox whose Spec.Image names an image (PrepareImage's result: a reference with
// its digest) sees that image, unpacked by package images, as its root instead of the
// host's /usr. The unpacked tree is shared by every sandbox of the image and is never
// written: each sandbox's root is a read-only overlay of two lower layers, a small
// skeleton of its own (the mount points bwrap needs: /workspace, /tmp, /proc, /dev, the
// synthetic /etc files; and the spec's links as symlinks into the workspace) on top of
// the image. What the image holds at a link's path (a task image's /app) is copied into
// the workspace folder the link leads to when the sandbox is seeded, owned by the
// sandbox user, so the agent works on the image's files as the task's Dockerfile left
// them. Snapshots, forks and restores are of the workspace as always; a fork gets its
// own skeleton on the same image.

// PrepareImage implements sandbox.ImagePreparer: it builds the source's context (or
// resolves its reference) with Config.Images, unpacks the image for this host, and
// returns the reference, with its digest, that Spec.Image takes. Without
// Config.Images it returns ErrUnavailable: such a runtime runs on the host's root.
func (r *Runtime) PrepareImage(ctx context.Context, src sandbox.ImageSource) (string, error) {
	if r.cfg.Images == nil {
		return "", fmt.Errorf("prepare image: %w: the process runtime was made without an image store (Config.Images)", sandbox.ErrUnavailable)
	}
	img, err := r.cfg.Images.Prepare(ctx, images.Source{Context: src.Context, Dockerfile: src.Dockerfile, Image: src.Image, Repository: src.Repository})
	if err != nil {
		return "", fmt.Errorf("prepare image: %w", err)
	}
	dir, err := r.cfg.Images.Unpack(ctx, img)
	if err != nil {
		return "", fmt.Errorf("prepare image: %w", err)
	}
	ref, _, _ := strings.Cut(img.Ref, "@")
	return ref + "@" + string(digest.NewDigestFromEncoded(digest.SHA256, filepath.Base(dir))), nil
}

// isImage reports whether a spec's image names one (not the host's root).
func isImage(image string) bool { return image != "" && image != "host" }

// imageDir returns the unpacked root of an image named as PrepareImage names it: the
// store's cache, found again by digest without the registry once unpacked.
func (r *Runtime) imageDir(ctx context.Context, image string) (string, error) {
	if r.cfg.Images == nil {
		return "", fmt.Errorf("%w: image: %q: this process runtime has no image store (it offers \"host\")", sandbox.ErrInvalid, image)
	}
	i := strings.LastIndexByte(image, '@')
	if i < 0 {
		return "", fmt.Errorf("%w: image: %q has no digest (use PrepareImage's result)", sandbox.ErrInvalid, image)
	}
	d, err := digest.Parse(image[i+1:])
	if err != nil {
		return "", fmt.Errorf("%w: image: %q: %v", sandbox.ErrInvalid, image, err)
	}
	dir, err := r.cfg.Images.Unpack(ctx, images.Image{Ref: image, Digest: d})
	if err != nil {
		return "", fmt.Errorf("image %s: %w", image, err)
	}
	return dir, nil
}

// imageDefaults are the ENV and USER of an image (PrepareImage's name), which its
// sandboxes get as docker run applies them: the ENV over the runtime's defaults, under
// the spec's own entries; the USER unless the spec names one.
func (r *Runtime) imageDefaults(ctx context.Context, image string) (env []string, user string, err error) {
	dir, err := r.imageDir(ctx, image)
	if err != nil {
		return nil, "", err
	}
	c, err := r.cfg.Images.UnpackedConfig(dir)
	if err != nil {
		return nil, "", err
	}
	for _, e := range c.Env {
		if k, _, ok := strings.Cut(e, "="); ok && k != "" && !strings.ContainsRune(e, 0) {
			env = append(env, e)
		}
	}
	return env, c.User, nil
}

var _ sandbox.ImageInspector = (*Runtime)(nil)

// ImageConfig implements sandbox.ImageInspector for an image PrepareImage returned.
func (r *Runtime) ImageConfig(ctx context.Context, image string) (sandbox.ImageConfig, error) {
	dir, err := r.imageDir(ctx, image)
	if err != nil {
		return sandbox.ImageConfig{}, fmt.Errorf("image config: %w", err)
	}
	c, err := r.cfg.Images.UnpackedConfig(dir)
	if err != nil {
		return sandbox.ImageConfig{}, fmt.Errorf("image config %s: %w", image, err)
	}
	return sandbox.ImageConfig{User: c.User, WorkingDir: c.WorkingDir}, nil
}

// execUser is who a sandbox with Spec.User runs its commands as, inside its user
// namespace (the host ids stay Config.HostUID/HostGID).
type execUser struct {
	UID  int    `json:"uid"`
	GID  int    `json:"gid"`
	Name string `json:"name"`
}

// resolveUser reads spec.User against the sandbox's root as runc does for Docker
// (moby/sys/user's GetExecUser): a name from the root's /etc/passwd with its primary
// group, a uid with the group its passwd line gives (0 without one), ":group" by name
// from /etc/group or by gid. An image root is read through os.Root, so its links cannot
// lead the reads out of it; a sandbox on the host's root has only the synthetic files'
// users (root, sandbox, nobody) and numbers.
func (r *Runtime) resolveUser(rec *boxRecord) (*execUser, error) {
	spec := rec.Handle.Spec
	if spec.User == "" {
		return nil, nil
	}
	files := map[string][]byte{}
	for _, name := range []string{"passwd", "group"} {
		var b []byte
		var err error
		if rec.Root != "" {
			b, err = readImageFile(rec.Root, "etc/"+name)
		} else {
			b, err = os.ReadFile(r.path("etc", name))
		}
		if err != nil {
			return nil, fmt.Errorf("user %q: /etc/%s: %w", spec.User, name, err)
		}
		files[name] = b
	}
	u, err := user.GetExecUser(spec.User, &user.ExecUser{}, bytes.NewReader(files["passwd"]), bytes.NewReader(files["group"]))
	if err != nil {
		return nil, fmt.Errorf("%w: user %q: %v", sandbox.ErrInvalid, spec.User, err)
	}
	eu := &execUser{UID: u.Uid, GID: u.Gid, Name: "user" + strconv.Itoa(u.Uid)}
	if us, err := user.ParsePasswdFilter(bytes.NewReader(files["passwd"]), func(p user.User) bool { return p.Uid == u.Uid }); err == nil && len(us) > 0 {
		eu.Name = us[0].Name
	}
	return eu, nil
}

// readImageFile reads name under an unpacked image root through os.Root (its links
// cannot lead out of it); a missing file is empty, as runc takes it.
func readImageFile(rootDir, name string) ([]byte, error) {
	root, err := os.OpenRoot(rootDir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	b, err := root.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return b, err
}

// nobody is the overflow uid and gid, whose lines the synthetic files always hold.
const nobody = 65534

// userEtc is the sandbox's own /etc/passwd and /etc/group when it has Spec.User: the
// runtime's synthetic files with its user (and group) in place of "sandbox", so that
// whoami, id and ls -l name them, home in the workspace as the runtime's own user's.
func userEtc(u *execUser) (passwd, group string) {
	passwd = "root:x:0:0:root:/root:/bin/sh\n"
	group = "root:x:0:\n"
	if u.UID != 0 && u.UID != nobody {
		passwd += fmt.Sprintf("%s:x:%d:%d:%s:%s:/bin/sh\n", u.Name, u.UID, u.GID, u.Name, sandbox.WorkspacePath)
	}
	if u.GID != 0 && u.GID != nobody {
		group += fmt.Sprintf("%s:x:%d:\n", u.Name, u.GID)
	}
	return passwd + "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n", group + "nogroup:x:65534:\n"
}

// userEtcPath is where a sandbox with Spec.User keeps its /etc/<name> (passwd, group):
// in its volume, removed with it.
func (r *Runtime) userEtcPath(rec *boxRecord, name string) string {
	return filepath.Join(r.volDir(rec.Volume), "user", name)
}

// writeUserEtc writes rec's own /etc/passwd and /etc/group (userEtc).
func (r *Runtime) writeUserEtc(rec *boxRecord) error {
	passwd, group := userEtc(rec.User)
	if err := os.MkdirAll(filepath.Dir(r.userEtcPath(rec, "passwd")), 0o755); err != nil {
		return fmt.Errorf("user files: %w", err)
	}
	for name, body := range map[string]string{"passwd": passwd, "group": group} {
		if err := os.WriteFile(r.userEtcPath(rec, name), []byte(body), 0o644); err != nil {
			return fmt.Errorf("user files: %w", err)
		}
	}
	return nil
}

// rootDir is where a sandbox with an image root has its root mounted, beside its
// workspace mount point ("." never occurs in an id).
func (r *Runtime) rootDir(id string) string { return filepath.Join(r.runDir, id+".root") }

// mountRoot makes rec's skeleton in its volume and mounts its read-only root over the
// image at rootDir.
func (r *Runtime) mountRoot(rec *boxRecord) error {
	skel := filepath.Join(r.volDir(rec.Volume), "root")
	if err := os.RemoveAll(skel); err != nil {
		return err
	}
	for _, d := range []string{"", "workspace", "tmp", "proc", "dev", "etc"} {
		if err := os.Mkdir(filepath.Join(skel, d), 0o755); err != nil {
			return fmt.Errorf("root skeleton: %w", err)
		}
	}
	for _, f := range etcFiles {
		if err := os.WriteFile(filepath.Join(skel, "etc", f), nil, 0o644); err != nil {
			return fmt.Errorf("root skeleton: %w", err)
		}
	}
	links := rec.Handle.Spec.Links
	for _, l := range slices.Sorted(maps.Keys(links)) {
		rel, _ := sandbox.CleanRelPath(links[l]) // validated
		if err := os.Symlink(path.Join(sandbox.WorkspacePath, rel), filepath.Join(skel, strings.TrimPrefix(l, "/"))); err != nil {
			return fmt.Errorf("root skeleton: link %s: %w", l, err)
		}
	}
	target := r.rootDir(rec.Handle.ID)
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	opts := "lowerdir=" + skel + ":" + rec.Root
	if err := unix.Mount("gauntlet-root", target, "overlay", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount image root: %w", err)
	}
	return nil
}

// unmountRoot undoes mountRoot; nothing for a sandbox on the host's root.
func (r *Runtime) unmountRoot(rec *boxRecord) error {
	if rec.Root == "" {
		return nil
	}
	target := r.rootDir(rec.Handle.ID)
	err := unmount(target)
	if rerr := os.Remove(target); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	return err
}

// seedFromImage copies what the image holds at each link's path into the workspace
// folder the link leads to, owned by the sandbox user. The image is read through
// os.Root, so its own links cannot lead the copy out of it.
func (r *Runtime) seedFromImage(rec *boxRecord) error {
	root, err := os.OpenRoot(rec.Root)
	if err != nil {
		return fmt.Errorf("image root: %w", err)
	}
	defer root.Close()
	ws, err := os.OpenRoot(r.workspace(rec))
	if err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	defer ws.Close()
	// The files are the sandbox user's now; set-id bits are dropped.
	owner := func(fs.FileInfo) (int, int) { return r.cfg.HostUID, r.cfg.HostGID }
	links := rec.Handle.Spec.Links
	for _, l := range slices.Sorted(maps.Keys(links)) {
		name := strings.TrimPrefix(l, "/")
		fi, err := root.Lstat(name)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue
		case err != nil:
			return fmt.Errorf("image's %s: %w", l, err)
		case !fi.IsDir():
			return fmt.Errorf("%w: links: the image holds %s, which is not a folder (%v)", sandbox.ErrInvalid, l, fi.Mode().Type())
		}
		rel, _ := sandbox.CleanRelPath(links[l]) // validated
		if err := sandbox.CopyTree(root, name, ws, rel, fs.ModePerm, owner); err != nil {
			return fmt.Errorf("copy the image's %s into the workspace: %w", l, err)
		}
	}
	return nil
}

// imageRootArgs are the bwrap arguments of a root over an image: the sandbox's
// read-only overlay, the synthetic /etc files over the image's, /proc and /dev.
func (r *Runtime) imageRootArgs(id string) []string {
	a := []string{"--ro-bind", r.rootDir(id), "/"}
	for i, f := range etcFiles {
		a = append(a, "--ro-bind-data", strconv.Itoa(7+i), "/etc/"+f)
	}
	return append(a, "--proc", "/proc", "--dev", "/dev")
}
