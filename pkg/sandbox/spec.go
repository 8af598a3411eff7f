package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"regexp"
	"slices"
	"strings"
)

// Spec describes the sandbox to create.
type Spec struct {
	// ID, when set, is the sandbox's id (letters, digits, '-', '_', at most 64); empty lets
	// the runtime choose one.
	ID string `json:"id,omitempty"`
	// Template names the sandbox template (pools and metrics group by it); free text.
	Template string `json:"template,omitempty"`
	// Image is the root filesystem: an image reference for containerd; for process, ""
	// or "host" (the host's /usr read-only). Runtimes reject images they cannot provide.
	Image string `json:"image,omitempty"`
	// Limits bound the sandbox's resources.
	Limits Limits `json:"limits"`
	// Network is the network mode; empty means NetworkLoopback.
	Network NetworkMode `json:"network,omitempty"`
	// Env is added to every exec's environment (KEY=VALUE).
	Env []string `json:"env,omitempty"`
	// Workspace seeds the workspace with files before the sandbox is handed out.
	Workspace []File `json:"workspace,omitempty"`
	// Labels are free key/values a runtime stores with the sandbox (episode id, task).
	Labels map[string]string `json:"labels,omitempty"`
	// Services are the host services the sandbox may reach through a fault gateway
	// (see Service; runtimes implementing ServiceListener support them).
	Services []Service `json:"services,omitempty"`
	// Links are paths at the root of the sandbox's filesystem that lead into its workspace
	// (path such as "/app": folder relative to the workspace, such as "app"), for tasks
	// written for fixed paths (Harbor's /app, /logs, /tests). The process runtime makes
	// them symlinks in every exec's root, and the folders in a new workspace (a fork keeps
	// its snapshot's); a runtime that cannot refuses the spec with
	// ErrUnsupported rather than run a task that would not find its files.
	Links map[string]string `json:"links,omitempty"`
	// User is who the sandbox's commands run as, in an image's USER form: a name or uid,
	// optionally ":" and a group name or gid; names are looked up in the root's
	// /etc/passwd and /etc/group, and a user alone runs with its primary group, as
	// Docker runs it. Empty: the image's USER when Image names one that says it (Create
	// fills it in, as it adds the image's ENV), else the runtime's own user (process: an
	// unprivileged "sandbox" user; containerd: root without capabilities).
	User string `json:"user,omitempty"`
}

// userRE is an image's USER: POSIX-ish names or numbers, an optional :group.
var userRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,31})?$`)

// reservedRoots are the root folders every runtime provides itself (.gauntlet: the
// containerd runtime's agent); a link may not hide one.
var reservedRoots = []string{".gauntlet", "bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "sys", "tmp", "usr", "workspace"}

// Limits are a sandbox's resource limits; zero fields take the Default* values.
type Limits struct {
	// MemoryBytes caps the sandbox's memory (RSS + page cache, no swap).
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// Pids caps the number of processes and threads alive at once.
	Pids int64 `json:"pids,omitempty"`
	// CPUMillis caps CPU bandwidth in thousandths of a core (1000 = one core).
	CPUMillis int64 `json:"cpu_millis,omitempty"`
	// DiskBytes caps the workspace's size (its copy-on-write layer and snapshots of it).
	DiskBytes int64 `json:"disk_bytes,omitempty"`
	// OpenFiles caps open file descriptors per process (RLIMIT_NOFILE).
	OpenFiles int64 `json:"open_files,omitempty"`
}

// Default limits.
const (
	DefaultMemoryBytes = 512 << 20
	DefaultPids        = 256
	DefaultCPUMillis   = 1000
	DefaultDiskBytes   = 512 << 20
	DefaultOpenFiles   = 1024
)

// NetworkMode is how a sandbox may use the network.
type NetworkMode string

// Network modes. Only loopback exists today: a private network namespace whose only
// interface is lo, so nothing leaves the sandbox.
const (
	NetworkLoopback NetworkMode = "loopback"
)

// File is one file seeded into the workspace.
type File struct {
	// Path is relative to the workspace root, slash-separated, without "..".
	Path string `json:"path"`
	Data []byte `json:"data"`
	// Mode is the permission bits; zero means 0644.
	Mode fs.FileMode `json:"mode,omitempty"`
}

// ValidID reports whether id is usable as a sandbox or snapshot id: 1-64 ASCII letters,
// digits, '_' or '-', starting with a letter or digit. (Checked by hand, not by a regexp:
// the containerd sandbox's agent links this package, and regexp and the unicode tables it
// pulls in cost it milliseconds of start-up in every sandbox.)
func ValidID(id string) bool {
	if len(id) == 0 || len(id) > 64 || !asciiAlnum(id[0]) {
		return false
	}
	for i := 1; i < len(id); i++ {
		if c := id[i]; !asciiAlnum(c) && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

func asciiAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// WithDefaults returns the spec with zero limits and the network mode filled in.
func (s Spec) WithDefaults() Spec {
	if s.Limits.MemoryBytes == 0 {
		s.Limits.MemoryBytes = DefaultMemoryBytes
	}
	if s.Limits.Pids == 0 {
		s.Limits.Pids = DefaultPids
	}
	if s.Limits.CPUMillis == 0 {
		s.Limits.CPUMillis = DefaultCPUMillis
	}
	if s.Limits.DiskBytes == 0 {
		s.Limits.DiskBytes = DefaultDiskBytes
	}
	if s.Limits.OpenFiles == 0 {
		s.Limits.OpenFiles = DefaultOpenFiles
	}
	if s.Network == "" {
		s.Network = NetworkLoopback
	}
	return s
}

// Validate returns every problem of the spec at once, each wrapping ErrInvalid and naming
// the field. It checks what every runtime needs; runtimes add their own checks.
func (s Spec) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s: %s", ErrInvalid, field, fmt.Sprintf(format, args...)))
	}
	if s.ID != "" && !ValidID(s.ID) {
		bad("id", "%q must be 1-64 letters, digits, '-' or '_', starting with a letter or digit", s.ID)
	}
	l := s.Limits
	if l.MemoryBytes < 0 || (l.MemoryBytes > 0 && l.MemoryBytes < 4<<20) {
		bad("limits.memory_bytes", "%d must be at least 4 MiB", l.MemoryBytes)
	}
	if l.Pids < 0 || (l.Pids > 0 && l.Pids < 8) {
		bad("limits.pids", "%d must be at least 8", l.Pids)
	}
	if l.CPUMillis < 0 || (l.CPUMillis > 0 && l.CPUMillis < 10) {
		bad("limits.cpu_millis", "%d must be at least 10", l.CPUMillis)
	}
	if l.DiskBytes < 0 || (l.DiskBytes > 0 && l.DiskBytes < 1<<20) {
		bad("limits.disk_bytes", "%d must be at least 1 MiB", l.DiskBytes)
	}
	if l.OpenFiles < 0 || (l.OpenFiles > 0 && l.OpenFiles < 16) {
		bad("limits.open_files", "%d must be at least 16", l.OpenFiles)
	}
	if s.Network != "" && s.Network != NetworkLoopback {
		bad("network", "%q is not a known mode (want %q)", s.Network, NetworkLoopback)
	}
	for i, e := range s.Env {
		if err := validEnv(e); err != nil {
			bad(fmt.Sprintf("env[%d]", i), "%v", err)
		}
	}
	errs = append(errs, validateServices(s.Services)...)
	for _, p := range slices.Sorted(maps.Keys(s.Links)) {
		name := strings.TrimPrefix(p, "/")
		switch {
		case !strings.HasPrefix(p, "/") || name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == "..":
			bad("links", "%q must be one folder at the root, such as /app", p)
		case slices.Contains(reservedRoots, name):
			bad("links", "%q would hide the sandbox's own %s", p, p)
		}
		if _, err := CleanRelPath(s.Links[p]); err != nil {
			bad("links["+p+"]", "%v", err)
		}
	}
	if s.User != "" && !userRE.MatchString(s.User) {
		bad("user", "%q is not a user (name or uid, optionally :group or :gid)", s.User)
	}
	seen := map[string]bool{}
	for i, f := range s.Workspace {
		p, err := CleanRelPath(f.Path)
		if err != nil {
			bad(fmt.Sprintf("workspace[%d].path", i), "%v", err)
			continue
		}
		if seen[p] {
			bad(fmt.Sprintf("workspace[%d].path", i), "%q appears twice", f.Path)
		}
		seen[p] = true
		if f.Mode&^fs.ModePerm != 0 {
			bad(fmt.Sprintf("workspace[%d].mode", i), "%v must be permission bits only", f.Mode)
		}
	}
	return errors.Join(errs...)
}

// Validate checks the request's fields, each problem wrapping ErrInvalid.
func (r ExecRequest) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s: %s", ErrInvalid, field, fmt.Sprintf(format, args...)))
	}
	if len(r.Argv) == 0 || r.Argv[0] == "" {
		bad("argv", "empty command")
	}
	for i, a := range r.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			bad(fmt.Sprintf("argv[%d]", i), "contains a NUL byte")
		}
	}
	for i, e := range r.Env {
		if err := validEnv(e); err != nil {
			bad(fmt.Sprintf("env[%d]", i), "%v", err)
		}
	}
	if strings.IndexByte(r.Dir, 0) >= 0 {
		bad("dir", "contains a NUL byte")
	}
	if r.Timeout < 0 {
		bad("timeout", "%v is negative", r.Timeout)
	}
	if r.OutputLimit < 0 {
		bad("output_limit", "%d is negative", r.OutputLimit)
	}
	return errors.Join(errs...)
}

// ExecDir returns the absolute working directory inside the sandbox for dir.
func ExecDir(dir string) string {
	if dir == "" {
		return WorkspacePath
	}
	if path.IsAbs(dir) {
		return path.Clean(dir)
	}
	return path.Join(WorkspacePath, dir)
}

func validEnv(e string) error {
	k, _, ok := strings.Cut(e, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q is not KEY=VALUE", e)
	}
	if strings.IndexByte(e, 0) >= 0 {
		return fmt.Errorf("%q contains a NUL byte", k)
	}
	return nil
}

// CleanRelPath checks that p names something inside a workspace: relative, no ".."
// component, no NUL. It returns the cleaned path ("." for the root).
func CleanRelPath(p string) (string, error) {
	if p == "" {
		return "", errors.New("empty path")
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", errors.New("path contains a NUL byte")
	}
	if path.IsAbs(p) {
		return "", fmt.Errorf("%q is absolute; paths are relative to the workspace", p)
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return "", fmt.Errorf("%q leaves the workspace (\"..\")", p)
		}
	}
	return path.Clean(p), nil
}
