package mcpenv

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"cel.dev/cel-go/cel"
	"gopkg.in/yaml.v3"
)

// Kind is the value of a declaration's `env` field.
const Kind = "mcp"

// Limits a declaration may set.
const (
	maxTools         = 256
	maxDeclBytes     = 1 << 20
	defaultMaxSteps  = 30
	defaultCallCost  = 100 * time.Millisecond
	defaultInvalid   = 5
	defaultDeadline  = 10 * time.Minute
	defaultVerifyFor = 60 * time.Second
	// maxWorkspace bounds the files a command server's workspace copies into the sandbox.
	maxWorkspace = 256 << 20
)

// Decl is one MCP env's declaration, as its file gives it. Unknown fields are refused.
type Decl struct {
	Env         string `yaml:"env"`
	Name        string `yaml:"name"`
	Description string `yaml:"description"`
	Server      Server `yaml:"server"`
	// Service is the fault target of the tools that name none (default: the env's name).
	Service string `yaml:"service"`
	// Tools is the action space, frozen by name: each must be listed by the server's
	// tools/list at every episode's reset (its description and input schema come from
	// there); the server's other tools are not offered.
	Tools []DeclTool `yaml:"tools"`
	// Task is the first observation's task; "{seed}" is replaced by the episode's seed.
	Task       string    `yaml:"task"`
	MaxSteps   uint32    `yaml:"max_steps"`
	MaxInvalid int       `yaml:"max_invalid"`
	DeadlineMs int64     `yaml:"deadline_ms"`
	CallCostMs int64     `yaml:"call_cost_ms"`
	Verifier   Verifier  `yaml:"verifier"`
	Oracle     []DeclAct `yaml:"oracle"`

	dir      string // the file's directory: relative server paths resolve against it
	file     string
	digest   [32]byte // of the file's content, so registering it again is a no-op
	success  cel.Program
	failure  cel.Program
	deadline time.Duration
	callCost time.Duration
}

// Server is how an episode reaches the MCP server: exactly one of Command and URL.
type Server struct {
	// Command is the server's argv, run in the episode's sandbox; it speaks MCP over its
	// stdin and stdout (the stdio transport).
	Command []string `yaml:"command"`
	// Workspace is a host directory (relative to the file) copied into the sandbox's
	// workspace before the server starts: the server's binary or scripts and their data.
	Workspace string `yaml:"workspace"`
	// Env adds KEY=VALUE entries to the server's environment (GAUNTLET_SEED is set too).
	Env []string `yaml:"env"`
	// HTTP, for a command, says the server speaks streamable HTTP on a port of the
	// sandbox's own loopback network instead of stdio.
	HTTP *ServerHTTP `yaml:"http"`
	// URL is a streamable HTTP MCP endpoint; each episode opens its own session.
	URL string `yaml:"url"`
	// TimeoutMs bounds one call's wall time (default 30000).
	TimeoutMs int64 `yaml:"timeout_ms"`
}

// ServerHTTP is where a command server listens in its sandbox: 127.0.0.1:Port, Path.
type ServerHTTP struct {
	Port int    `yaml:"port"`
	Path string `yaml:"path"`
}

// DeclTool is one tool of the action space.
type DeclTool struct {
	Name    string `yaml:"name"`
	Service string `yaml:"service"`
}

// Verifier decides the episode's verdict: a CEL condition (Success, and optionally
// Failure) over the recorded calls, evaluated after every call; or a Command run in the
// sandbox when the agent submits or the episode runs out of steps or time.
type Verifier struct {
	Success   string   `yaml:"success"`
	Failure   string   `yaml:"failure"`
	Command   []string `yaml:"command"`
	TimeoutMs int64    `yaml:"timeout_ms"`
}

// DeclAct is one action of the declaration's oracle plan; "{seed}" in its arguments'
// strings is replaced by the episode's seed.
type DeclAct struct {
	Tool string         `yaml:"tool"`
	Args map[string]any `yaml:"args"`
}

var (
	nameRE = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`)
	toolRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`)
	envRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)
)

// ErrInvalid is wrapped by every error a declaration's loading reports.
var ErrInvalid = errors.New("invalid MCP env declaration")

// Load reads and checks one declaration file. Every problem is reported at once, each
// naming the file and the field (and the line, for YAML errors).
func Load(path string) (*Decl, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load MCP env %s: %w", path, err)
	}
	if len(data) > maxDeclBytes {
		return nil, fmt.Errorf("%s: %w: the file is over %d bytes", path, ErrInvalid, maxDeclBytes)
	}
	var d Decl
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("%s: %w: %v", path, ErrInvalid, err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("load MCP env %s: %w", path, err)
	}
	d.file, d.dir, d.digest = path, filepath.Dir(abs), sha256.Sum256(data)
	if errs := d.check(); len(errs) > 0 {
		for i, e := range errs {
			errs[i] = fmt.Errorf("%s: %w", path, e)
		}
		return nil, errors.Join(errs...)
	}
	return &d, nil
}

// check validates the declaration and compiles its CEL verifier.
func (d *Decl) check() []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s: %s", ErrInvalid, field, fmt.Sprintf(format, args...)))
	}
	if d.Env != Kind {
		bad("env", "%q: must be %q", d.Env, Kind)
	}
	if !nameRE.MatchString(d.Name) {
		bad("name", "%q: must be 1-32 lower-case letters, digits, '_' or '-', starting with a letter", d.Name)
	}
	if d.Service == "" {
		d.Service = d.Name
	}
	if !nameRE.MatchString(d.Service) {
		bad("service", "%q: must be 1-32 lower-case letters, digits, '_' or '-', starting with a letter", d.Service)
	}
	s := &d.Server
	switch {
	case len(s.Command) > 0 && s.URL != "":
		bad("server", "give command or url, not both")
	case len(s.Command) == 0 && s.URL == "":
		bad("server", "give command (a stdio server run in the sandbox) or url (a streamable HTTP endpoint)")
	case s.URL != "":
		if u, err := url.Parse(s.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("server.url", "%q: must be an http or https URL", s.URL)
		}
		if s.Workspace != "" || len(s.Env) > 0 || s.HTTP != nil {
			bad("server", "workspace, env and http are for a command server, not a url")
		}
	default:
		for i, a := range s.Command {
			if a == "" || strings.ContainsRune(a, 0) {
				bad(fmt.Sprintf("server.command[%d]", i), "empty or holds a NUL byte")
			}
		}
		if h := s.HTTP; h != nil {
			if h.Port < 1 || h.Port > 65535 {
				bad("server.http.port", "%d must be 1-65535", h.Port)
			}
			if h.Path == "" {
				h.Path = "/mcp"
			}
			if !strings.HasPrefix(h.Path, "/") || strings.ContainsAny(h.Path, "?# ") {
				bad("server.http.path", "%q must be a URL path starting with /", h.Path)
			}
		}
		for i, e := range s.Env {
			if !envRE.MatchString(e) {
				bad(fmt.Sprintf("server.env[%d]", i), "%q: must be KEY=VALUE", e)
			}
		}
		if s.Workspace != "" {
			p := s.Workspace
			if !filepath.IsAbs(p) {
				p = filepath.Join(d.dir, p)
			}
			if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
				bad("server.workspace", "%q is not a directory", s.Workspace)
			} else if p, err = filepath.EvalSymlinks(p); err != nil {
				bad("server.workspace", "%v", err)
			} else {
				s.Workspace = p // the folder itself may be a link; links inside it are refused
			}
		}
	}
	if s.TimeoutMs == 0 {
		s.TimeoutMs = 30_000
	}
	if s.TimeoutMs < 100 || s.TimeoutMs > 600_000 {
		bad("server.timeout_ms", "%d is outside 100..600000", s.TimeoutMs)
	}
	switch n := len(d.Tools); {
	case n == 0:
		bad("tools", "list the tools the env offers (names the server's tools/list gives)")
	case n > maxTools:
		bad("tools", "%d tools: at most %d", n, maxTools)
	}
	seen := map[string]bool{}
	for i, t := range d.Tools {
		f := fmt.Sprintf("tools[%d]", i)
		switch {
		case !toolRE.MatchString(t.Name):
			bad(f+".name", "%q: must be 1-128 letters, digits, '_', '.' or '-'", t.Name)
		case t.Name == ToolSubmit:
			bad(f+".name", "%q is gauntlet's own tool (the command verifier's submit)", t.Name)
		case seen[t.Name]:
			bad(f+".name", "%q appears twice", t.Name)
		}
		seen[t.Name] = true
		if t.Service != "" && !nameRE.MatchString(t.Service) {
			bad(f+".service", "%q: must be 1-32 lower-case letters, digits, '_' or '-', starting with a letter", t.Service)
		}
	}
	if strings.TrimSpace(d.Task) == "" {
		bad("task", "required: what the agent is asked to do")
	}
	if d.MaxSteps == 0 {
		d.MaxSteps = defaultMaxSteps
	}
	if d.MaxSteps > 10_000 {
		bad("max_steps", "%d: at most 10000", d.MaxSteps)
	}
	if d.MaxInvalid == 0 {
		d.MaxInvalid = defaultInvalid
	}
	if d.MaxInvalid < 1 || d.MaxInvalid > 1000 {
		bad("max_invalid", "%d is outside 1..1000", d.MaxInvalid)
	}
	d.deadline = defaultDeadline
	if d.DeadlineMs != 0 {
		if d.DeadlineMs < 1 || d.DeadlineMs > 86_400_000 {
			bad("deadline_ms", "%d is outside 1..86400000", d.DeadlineMs)
		}
		d.deadline = time.Duration(d.DeadlineMs) * time.Millisecond
	}
	d.callCost = defaultCallCost
	if d.CallCostMs != 0 {
		if d.CallCostMs < 0 || d.CallCostMs > 3_600_000 {
			bad("call_cost_ms", "%d is outside 0..3600000", d.CallCostMs)
		}
		d.callCost = time.Duration(d.CallCostMs) * time.Millisecond
	}
	v := &d.Verifier
	switch {
	case v.Success == "" && len(v.Command) == 0:
		bad("verifier", "give success (a CEL condition over the calls) or command (run in the sandbox)")
	case v.Success != "" && len(v.Command) > 0:
		bad("verifier", "give success (and failure) or command, not both")
	case len(v.Command) > 0:
		if s.URL != "" {
			bad("verifier.command", "a command verifier runs in the server's sandbox: the server must be a command")
		}
		if v.Failure != "" {
			bad("verifier.failure", "only with success (a command's exit status is its verdict)")
		}
		for i, a := range v.Command {
			if a == "" || strings.ContainsRune(a, 0) {
				bad(fmt.Sprintf("verifier.command[%d]", i), "empty or holds a NUL byte")
			}
		}
	default:
		var err error
		if d.success, err = compile(v.Success); err != nil {
			bad("verifier.success", "%v", err)
		}
		if v.Failure != "" {
			if d.failure, err = compile(v.Failure); err != nil {
				bad("verifier.failure", "%v", err)
			}
		}
	}
	if v.TimeoutMs == 0 {
		v.TimeoutMs = defaultVerifyFor.Milliseconds()
	}
	if v.TimeoutMs < 100 || v.TimeoutMs > 3_600_000 {
		bad("verifier.timeout_ms", "%d is outside 100..3600000", v.TimeoutMs)
	}
	for i, a := range d.Oracle {
		if !seen[a.Tool] && !(a.Tool == ToolSubmit && len(v.Command) > 0) {
			bad(fmt.Sprintf("oracle[%d].tool", i), "%q is not one of tools", a.Tool)
		}
	}
	return errs
}

// LoadDir loads every *.yaml and *.yml file of dir, reporting every invalid one.
func LoadDir(dir string) ([]*Decl, error) {
	var files []string
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir && e.IsDir() {
			return filepath.SkipDir
		}
		if ext := filepath.Ext(p); !e.IsDir() && (ext == ".yaml" || ext == ".yml") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("load MCP envs %s: %w", dir, err)
	}
	slices.Sort(files)
	var (
		out  []*Decl
		errs []error
	)
	names := map[string]string{}
	for _, f := range files {
		d, err := Load(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if prev, ok := names[d.Name]; ok {
			errs = append(errs, fmt.Errorf("%s: %w: name: %q is also %s's", f, ErrInvalid, d.Name, prev))
			continue
		}
		names[d.Name] = f
		out = append(out, d)
	}
	return out, errors.Join(errs...)
}
