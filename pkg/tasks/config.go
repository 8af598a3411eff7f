package tasks

import (
	"errors"
	"fmt"
	"math"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/BurntSushi/toml"
)

// Defaults Harbor's documentation gives for keys a task.toml leaves out.
const (
	DefaultVersion      = "1.0"
	DefaultTimeout      = 600 * time.Second
	DefaultCPUs         = 1
	DefaultMemoryMB     = 2048
	DefaultStorageMB    = 10240
	DefaultAllowNetwork = true
)

// Harbor's network modes ([environment].network_mode).
const (
	NetworkPublic    = "public"
	NetworkNone      = "no-network"
	NetworkAllowlist = "allowlist"
)

// MaxAllowedHosts bounds allowed_hosts: a task that needs more is not what an allow-list
// is for.
const MaxAllowedHosts = 64

// MaxTimeout bounds every timeout of a task.toml: a day is longer than any task gauntlet
// should hold a sandbox for, and a bound keeps a typo (an extra zero or two) from pinning
// a sandbox for weeks.
const MaxTimeout = 24 * time.Hour

// Difficulties are the values [metadata].difficulty may take, as Harbor's documentation
// lists them.
var Difficulties = []string{"easy", "medium", "hard"}

// supportedVersions are the task.toml schema versions this reader knows: "version" 1.0 of
// the original format, and "schema_version" 1.1 to 1.4, which add the [task] table.
var supportedVersions = []string{"1.0", "1.1", "1.2", "1.3", "1.4"}

// Config is a task.toml, checked and with Harbor's defaults applied.
type Config struct {
	// Version is the schema version ("version" or "schema_version"; DefaultVersion when
	// the file names none).
	Version string
	// Source is where the task came from, free text ("source").
	Source string
	// Task is the [task] table of schema 1.1 and later; its zero value when absent.
	Task TaskInfo
	// Metadata is the [metadata] table.
	Metadata Metadata
	Agent    Agent
	Verifier Verifier
	Solution Solution
	// Environment is the [environment] table.
	Environment EnvironmentConfig
}

// TaskInfo is the [task] table: a task's published identity.
type TaskInfo struct {
	// Name is "<org>/<name>", as Harbor's registry keys tasks.
	Name        string
	Description string
	Authors     []Author
	Keywords    []string
}

// Author is one author of a task.
type Author struct {
	Name  string `toml:"name" json:"name"`
	Email string `toml:"email" json:"email,omitempty"`
}

// Metadata is the [metadata] table. Harbor leaves its keys to the task's author; the ones
// gauntlet filters and reports on are typed here, and the rest are kept in Extra.
type Metadata struct {
	// Difficulty is one of Difficulties, or "" when the task does not say.
	Difficulty string
	Category   string
	Tags       []string
	// Authors joins author_name/author_email and [[metadata.authors]].
	Authors []Author
	// Canary marks a task no agent can solve honestly (canary = true): its verifier can
	// only pass if the agent games it, so any success of an episode of it is proof of a
	// hack (docs/tasks.md, Canaries). A draw from a dataset never plays one unless asked
	// (Filter.Canaries).
	Canary bool
	// Extra holds every other key of the table, as decoded.
	Extra map[string]any
}

// Agent is the [agent] table.
type Agent struct {
	// Timeout is how long the agent may work (timeout_sec).
	Timeout time.Duration
	// SetupTimeout bounds the agent's own setup (setup_timeout_sec), 0 when unset.
	SetupTimeout time.Duration
	// User is the OS user the agent runs as, "" for the image's.
	User string
}

// Verifier is the [verifier] table.
type Verifier struct {
	// Timeout is how long tests/test.sh may run (timeout_sec).
	Timeout time.Duration
	// Env is added to test.sh's environment.
	Env map[string]string
	// User is the OS user the verifier runs as, "" for the image's.
	User string
}

// Solution is the [solution] table.
type Solution struct {
	// Env is added to solve.sh's environment.
	Env map[string]string
}

// EnvironmentConfig is the [environment] table: how the sandbox is made and what it may use.
type EnvironmentConfig struct {
	// BuildTimeout bounds building environment/Dockerfile (build_timeout_sec).
	BuildTimeout time.Duration
	// DockerImage is a prebuilt image to run instead of building the Dockerfile.
	DockerImage string
	CPUs        int
	MemoryMB    int
	StorageMB   int
	GPUs        int
	GPUTypes    []string
	// AllowInternet is whether the sandbox may reach the network (default true in Harbor's
	// format; gauntlet's runtimes decide what they grant): NetworkMode is NetworkPublic.
	AllowInternet bool
	// NetworkMode is Harbor's network_mode: NetworkPublic, NetworkNone or
	// NetworkAllowlist; when the file leaves it out, allow_internet decides between the
	// first two. gauntlet's sandboxes never reach the internet: public and no-network
	// both run without a network, and an allowlist reaches AllowedHosts alone, through
	// gauntlet's proxy.
	NetworkMode string
	// AllowedHosts are the host names an allowlist task may reach (allowed_hosts): over
	// plain HTTP, port 80, each request through the fault proxy and recorded.
	AllowedHosts []string
	MCPServers   []MCPServer
	// SkillsDir is a folder of the environment whose contents go to the agent's skills.
	SkillsDir string
}

// MCPServer is one [[environment.mcp_servers]] entry.
type MCPServer struct {
	Name      string   `toml:"name" json:"name"`
	Transport string   `toml:"transport" json:"transport"`
	URL       string   `toml:"url" json:"url,omitempty"`
	Command   string   `toml:"command" json:"command,omitempty"`
	Args      []string `toml:"args" json:"args,omitempty"`
}

// Tags are the task's labels for filtering: [metadata].tags and [task].keywords, each once,
// in the order written.
func (c *Config) Tags() []string {
	out := make([]string, 0, len(c.Metadata.Tags)+len(c.Task.Keywords))
	for _, t := range append(slices.Clip(c.Metadata.Tags), c.Task.Keywords...) {
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// rawDoc is task.toml's top level. Each table is decoded on its own from a Primitive so
// that a type error in one table does not hide the problems of the others.
type rawDoc struct {
	Version       toml.Primitive `toml:"version"`
	SchemaVersion toml.Primitive `toml:"schema_version"`
	Source        toml.Primitive `toml:"source"`
	Task          toml.Primitive `toml:"task"`
	Metadata      toml.Primitive `toml:"metadata"`
	Agent         toml.Primitive `toml:"agent"`
	Verifier      toml.Primitive `toml:"verifier"`
	Solution      toml.Primitive `toml:"solution"`
	Environment   toml.Primitive `toml:"environment"`
}

type rawTask struct {
	Name        string   `toml:"name"`
	Description string   `toml:"description"`
	Authors     []Author `toml:"authors"`
	Keywords    []string `toml:"keywords"`
}

type rawAgent struct {
	TimeoutSec      *float64 `toml:"timeout_sec"`
	SetupTimeoutSec *float64 `toml:"setup_timeout_sec"`
	User            string   `toml:"user"`
	rawPhaseNetwork
}

type rawVerifier struct {
	TimeoutSec *float64          `toml:"timeout_sec"`
	Env        map[string]string `toml:"env"`
	User       string            `toml:"user"`
	rawPhaseNetwork
}

// rawPhaseNetwork are Harbor's per-phase network overrides of [agent] and [verifier],
// read to be refused by name: gauntlet sets a sandbox's network once, for the episode.
type rawPhaseNetwork struct {
	NetworkMode  *string  `toml:"network_mode"`
	AllowedHosts []string `toml:"allowed_hosts"`
}

// refuse reports the overrides of table as unsupported.
func (r rawPhaseNetwork) refuse(add func(string, string, ...any), table string) {
	const why = "per-phase network policies are not supported by gauntlet (its sandbox's network is set once per episode); set [environment].network_mode and allowed_hosts"
	if r.NetworkMode != nil {
		add(table+".network_mode", why)
	}
	if r.AllowedHosts != nil {
		add(table+".allowed_hosts", why)
	}
}

type rawSolution struct {
	Env map[string]string `toml:"env"`
}

type rawEnvironment struct {
	BuildTimeoutSec *float64    `toml:"build_timeout_sec"`
	DockerImage     string      `toml:"docker_image"`
	CPUs            *int64      `toml:"cpus"`
	MemoryMB        *int64      `toml:"memory_mb"`
	StorageMB       *int64      `toml:"storage_mb"`
	Memory          *string     `toml:"memory"`
	Storage         *string     `toml:"storage"`
	GPUs            *int64      `toml:"gpus"`
	GPUTypes        []string    `toml:"gpu_types"`
	AllowInternet   *bool       `toml:"allow_internet"`
	NetworkMode     *string     `toml:"network_mode"`
	AllowedHosts    []string    `toml:"allowed_hosts"`
	MCPServers      []MCPServer `toml:"mcp_servers"`
	SkillsDir       string      `toml:"skills_dir"`
}

// ParseConfig reads a task.toml. The error joins a *FieldError for every problem found,
// with its Task empty (Load names the task); the Config is then partial and must not be
// used.
func ParseConfig(data []byte) (Config, error) {
	var errs []error
	add := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Field: field, Err: fmt.Errorf(format, args...)})
	}
	var doc rawDoc
	md, err := toml.Decode(string(data), &doc)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return Config{}, &FieldError{Field: pe.LastKey, Line: pe.Position.Line, Err: errors.New(pe.Message)}
		}
		return Config{}, &FieldError{Err: err}
	}
	// bad lists the tables whose decoding stopped at a type error: their later keys were
	// not decoded, so they would be misreported as unknown.
	bad := map[string]bool{}
	decode := func(name string, p toml.Primitive, v any) bool {
		if !md.IsDefined(name) {
			return false
		}
		if err := md.PrimitiveDecode(p, v); err != nil {
			bad[name] = true
			var pe toml.ParseError
			if errors.As(err, &pe) {
				errs = append(errs, &FieldError{Field: pe.LastKey, Line: pe.Position.Line, Err: errors.New(pe.Message)})
			} else {
				errs = append(errs, typeError(name, err))
			}
			return false
		}
		return true
	}

	var c Config
	var version, schemaVersion string
	decode("version", doc.Version, &version)
	decode("schema_version", doc.SchemaVersion, &schemaVersion)
	switch {
	case version != "" && schemaVersion != "":
		add("schema_version", "both version and schema_version are set; write one")
		c.Version = schemaVersion
	case schemaVersion != "":
		c.Version = schemaVersion
	case version != "":
		c.Version = version
	default:
		c.Version = DefaultVersion
	}
	if !bad["version"] && !bad["schema_version"] && !slices.Contains(supportedVersions, c.Version) {
		field := "version"
		if schemaVersion != "" {
			field = "schema_version"
		}
		add(field, "unsupported schema version %q (this reader knows %s)", c.Version, strings.Join(supportedVersions, ", "))
	}
	decode("source", doc.Source, &c.Source)

	var rt rawTask
	if decode("task", doc.Task, &rt) {
		c.Task = TaskInfo(rt)
		if rt.Name != "" && !taskNameRE.MatchString(rt.Name) {
			add("task.name", "%q is not <org>/<name> (letters, digits, '.', '_', '-')", rt.Name)
		}
		for i, a := range rt.Authors {
			if strings.TrimSpace(a.Name) == "" {
				add(fmt.Sprintf("task.authors[%d].name", i), "empty")
			}
		}
		checkLabels(add, "task.keywords", rt.Keywords)
	}

	var meta map[string]any
	if decode("metadata", doc.Metadata, &meta) {
		c.Metadata = parseMetadata(meta, add)
	}

	c.Agent.Timeout = DefaultTimeout
	var ra rawAgent
	if decode("agent", doc.Agent, &ra) {
		c.Agent.Timeout = timeout(add, "agent.timeout_sec", ra.TimeoutSec, DefaultTimeout)
		c.Agent.SetupTimeout = timeout(add, "agent.setup_timeout_sec", ra.SetupTimeoutSec, 0)
		c.Agent.User = ra.User
		checkUser(add, "agent.user", ra.User)
		ra.refuse(add, "agent")
	}

	c.Verifier.Timeout = DefaultTimeout
	var rv rawVerifier
	if decode("verifier", doc.Verifier, &rv) {
		c.Verifier.Timeout = timeout(add, "verifier.timeout_sec", rv.TimeoutSec, DefaultTimeout)
		c.Verifier.Env = rv.Env
		c.Verifier.User = rv.User
		checkEnv(add, "verifier.env", rv.Env)
		checkUser(add, "verifier.user", rv.User)
		rv.refuse(add, "verifier")
	}

	var rs rawSolution
	if decode("solution", doc.Solution, &rs) {
		c.Solution.Env = rs.Env
		checkEnv(add, "solution.env", rs.Env)
	}

	c.Environment = EnvironmentConfig{
		BuildTimeout: DefaultTimeout, CPUs: DefaultCPUs, MemoryMB: DefaultMemoryMB,
		StorageMB: DefaultStorageMB, AllowInternet: DefaultAllowNetwork, NetworkMode: NetworkPublic,
	}
	var re rawEnvironment
	if decode("environment", doc.Environment, &re) {
		parseEnvironment(&c.Environment, &re, add)
	}

	// An unknown table is reported once, not once more for each of its keys; [metadata]
	// is free-form and parseMetadata checked the keys it types.
	var unknown []toml.Key
	for _, k := range md.Undecoded() {
		if len(k) == 0 || bad[k[0]] || k[0] == "metadata" {
			continue
		}
		if slices.ContainsFunc(unknown, func(u toml.Key) bool { return len(u) < len(k) && slices.Equal(u, k[:len(u)]) }) {
			continue
		}
		unknown = append(unknown, k)
		errs = append(errs, &FieldError{Field: k.String(), Err: ErrUnknownKey})
	}
	return c, errors.Join(errs...)
}

// ErrUnknownKey is the reason of a *FieldError for a task.toml key the format does not have.
var ErrUnknownKey = errors.New("unknown key")

// lastKeyRE finds the key and line a type error of the TOML library names in its text:
// PrimitiveDecode reports them as plain errors, not as ParseError values.
var lastKeyRE = regexp.MustCompile(`^toml: (?:line (\d+) )?\(last key "([^"]*)"\): (.*)$`)

// typeError turns a decoding error of table into a *FieldError naming the key at fault
// when the library says which.
func typeError(table string, err error) *FieldError {
	m := lastKeyRE.FindStringSubmatch(err.Error())
	if m == nil {
		return &FieldError{Field: table, Err: errors.New(strings.TrimPrefix(err.Error(), "toml: "))}
	}
	line, _ := strconv.Atoi(m[1]) // empty when the library gave no line
	return &FieldError{Field: m[2], Line: line, Err: errors.New(m[3])}
}

var (
	taskNameRE = regexp.MustCompile(`^[A-Za-z0-9._-]+/[A-Za-z0-9._-]+$`)
	envNameRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	userRE     = regexp.MustCompile(`^[a-z_][a-z0-9_-]*\$?$|^[0-9]+$`)
)

// timeout checks an optional timeout in seconds: finite, positive, at most MaxTimeout.
func timeout(add func(string, string, ...any), field string, sec *float64, def time.Duration) time.Duration {
	if sec == nil {
		return def
	}
	s := *sec
	switch {
	case math.IsNaN(s) || math.IsInf(s, 0):
		add(field, "%v is not a number of seconds", s)
	case s <= 0:
		add(field, "%v: a timeout must be positive", s)
	case s > MaxTimeout.Seconds():
		add(field, "%v seconds is longer than the %v gauntlet allows", s, MaxTimeout)
	default:
		d := time.Duration(s * float64(time.Second))
		if d <= 0 {
			add(field, "%v seconds rounds to no time at all", s)
			return def
		}
		return d
	}
	return def
}

func checkEnv(add func(string, string, ...any), field string, env map[string]string) {
	for k, v := range env {
		if !envNameRE.MatchString(k) {
			add(field+"."+k, "not a valid environment variable name")
		}
		if strings.IndexByte(v, 0) >= 0 {
			add(field+"."+k, "value holds a NUL byte")
		}
	}
}

func checkUser(add func(string, string, ...any), field, user string) {
	if user != "" && !userRE.MatchString(user) {
		add(field, "%q is not a user name or uid", user)
	}
}

// checkLabels checks tags and keywords: free text in Harbor's format, so only what would
// break a listing or a filter is refused (empty labels, control characters). A label
// given twice is harmless; Tags lists it once.
func checkLabels(add func(string, string, ...any), field string, labels []string) {
	for i, l := range labels {
		if strings.TrimSpace(l) == "" || strings.ContainsFunc(l, unicode.IsControl) || !utf8.ValidString(l) {
			add(fmt.Sprintf("%s[%d]", field, i), "%q is not a label (empty, or holding control characters)", l)
		}
	}
}

// parseMetadata types the [metadata] keys gauntlet reads and keeps the others as they are.
func parseMetadata(meta map[string]any, add func(string, string, ...any)) Metadata {
	var m Metadata
	str := func(key string) string {
		v, ok := meta[key]
		if !ok {
			return ""
		}
		s, ok := v.(string)
		if !ok {
			add("metadata."+key, "must be a string, not %s", tomlType(v))
		}
		return s
	}
	m.Difficulty = str("difficulty")
	if m.Difficulty != "" && !slices.Contains(Difficulties, m.Difficulty) {
		add("metadata.difficulty", "%q is not one of %s", m.Difficulty, strings.Join(Difficulties, ", "))
	}
	m.Category = str("category")
	if v, ok := meta["tags"]; ok {
		list, ok := v.([]any)
		if !ok {
			add("metadata.tags", "must be a list of strings, not %s", tomlType(v))
		}
		for i, e := range list {
			s, ok := e.(string)
			if !ok {
				add(fmt.Sprintf("metadata.tags[%d]", i), "must be a string, not %s", tomlType(e))
				continue
			}
			m.Tags = append(m.Tags, s)
		}
		checkLabels(add, "metadata.tags", m.Tags)
	}
	name, email := str("author_name"), str("author_email")
	if name != "" || email != "" {
		m.Authors = append(m.Authors, Author{Name: name, Email: email})
	}
	if v, ok := meta["authors"]; ok {
		list, ok := v.([]map[string]any)
		if !ok {
			add("metadata.authors", "must be a list of tables with name and email, not %s", tomlType(v))
		}
		for i, a := range list {
			var au Author
			for k, x := range a {
				s, ok := x.(string)
				switch {
				case k != "name" && k != "email":
					add(fmt.Sprintf("metadata.authors[%d].%s", i, k), "%v", ErrUnknownKey)
				case !ok:
					add(fmt.Sprintf("metadata.authors[%d].%s", i, k), "must be a string, not %s", tomlType(x))
				case k == "name":
					au.Name = s
				default:
					au.Email = s
				}
			}
			if au.Name == "" {
				add(fmt.Sprintf("metadata.authors[%d].name", i), "missing")
			}
			m.Authors = append(m.Authors, au)
		}
	}
	if v, ok := meta["canary"]; ok {
		b, ok := v.(bool)
		if !ok {
			add("metadata.canary", "must be a boolean, not %s", tomlType(v))
		}
		m.Canary = b
	}
	for k, v := range meta {
		switch k {
		case "difficulty", "category", "tags", "author_name", "author_email", "authors", "canary":
			continue
		}
		if m.Extra == nil {
			m.Extra = map[string]any{}
		}
		m.Extra[k] = v
	}
	return m
}

// tomlType names a decoded TOML value's type for an error message.
func tomlType(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case int64:
		return "an integer"
	case float64:
		return "a float"
	case bool:
		return "a boolean"
	case time.Time:
		return "a date or time"
	case []any, []map[string]any:
		return "an array"
	case map[string]any:
		return "a table"
	}
	return fmt.Sprintf("%T", v)
}

func parseEnvironment(e *EnvironmentConfig, r *rawEnvironment, add func(string, string, ...any)) {
	e.BuildTimeout = timeout(add, "environment.build_timeout_sec", r.BuildTimeoutSec, DefaultTimeout)
	e.DockerImage = r.DockerImage
	if r.DockerImage != "" && !imageRefRE.MatchString(r.DockerImage) {
		add("environment.docker_image", "%q is not an image reference", r.DockerImage)
	}
	count := func(field string, v *int64, def int, min int64) int {
		if v == nil {
			return def
		}
		if *v < min || *v > math.MaxInt32 {
			add(field, "%d is out of range (%d or more)", *v, min)
			return def
		}
		return int(*v)
	}
	e.CPUs = count("environment.cpus", r.CPUs, DefaultCPUs, 1)
	e.MemoryMB = count("environment.memory_mb", r.MemoryMB, DefaultMemoryMB, 1)
	e.StorageMB = count("environment.storage_mb", r.StorageMB, DefaultStorageMB, 1)
	e.GPUs = count("environment.gpus", r.GPUs, 0, 0)
	// memory and storage are the deprecated spellings ("2G", "512M"); one of each pair.
	if r.Memory != nil {
		if r.MemoryMB != nil {
			add("environment.memory", "set together with memory_mb; write only memory_mb")
		} else if mb, err := parseSizeMB(*r.Memory); err != nil {
			add("environment.memory", "%v", err)
		} else {
			e.MemoryMB = mb
		}
	}
	if r.Storage != nil {
		if r.StorageMB != nil {
			add("environment.storage", "set together with storage_mb; write only storage_mb")
		} else if mb, err := parseSizeMB(*r.Storage); err != nil {
			add("environment.storage", "%v", err)
		} else {
			e.StorageMB = mb
		}
	}
	e.GPUTypes = r.GPUTypes
	if r.AllowInternet != nil {
		e.AllowInternet = *r.AllowInternet
		if !e.AllowInternet {
			e.NetworkMode = NetworkNone
		}
	}
	parseNetwork(e, r, add)
	for i, s := range r.MCPServers {
		f := fmt.Sprintf("environment.mcp_servers[%d]", i)
		if s.Name == "" {
			add(f+".name", "missing")
		}
		switch s.Transport {
		case "sse", "streamable-http":
			if s.URL == "" {
				add(f+".url", "missing (transport %s needs a url)", s.Transport)
			}
			if s.Command != "" || len(s.Args) > 0 {
				add(f+".command", "only transport stdio takes a command")
			}
		case "stdio":
			if s.Command == "" {
				add(f+".command", "missing (transport stdio needs a command)")
			}
			if s.URL != "" {
				add(f+".url", "transport stdio takes no url")
			}
		default:
			add(f+".transport", "%q is not one of sse, streamable-http, stdio", s.Transport)
		}
	}
	e.MCPServers = r.MCPServers
	e.SkillsDir = r.SkillsDir
}

// parseNetwork reads network_mode and allowed_hosts, as Harbor's "Network Policy" page
// gives them: a mode of public, no-network or allowlist, and for an allowlist the hosts
// it may reach (none: no egress at all). allow_internet is the deprecated spelling of
// the first two, so it may not be set with network_mode.
func parseNetwork(e *EnvironmentConfig, r *rawEnvironment, add func(string, string, ...any)) {
	if r.NetworkMode != nil {
		switch m := *r.NetworkMode; m {
		case NetworkPublic, NetworkNone, NetworkAllowlist:
			e.NetworkMode = m
			e.AllowInternet = m == NetworkPublic
		default:
			add("environment.network_mode", "%q is not one of %s, %s, %s", m, NetworkPublic, NetworkNone, NetworkAllowlist)
		}
		if r.AllowInternet != nil {
			add("environment.allow_internet", "set together with network_mode; write only network_mode (allow_internet is its deprecated spelling)")
		}
	}
	if r.AllowedHosts == nil {
		return
	}
	if e.NetworkMode != NetworkAllowlist {
		add("environment.allowed_hosts", "only read with network_mode = %q (this task's mode is %q)", NetworkAllowlist, e.NetworkMode)
		return
	}
	if len(r.AllowedHosts) > MaxAllowedHosts {
		add("environment.allowed_hosts", "%d hosts: at most %d", len(r.AllowedHosts), MaxAllowedHosts)
		return
	}
	seen := map[string]bool{}
	for i, h := range r.AllowedHosts {
		f := fmt.Sprintf("environment.allowed_hosts[%d]", i)
		switch {
		case strings.Contains(h, "://") || strings.Contains(h, "/"):
			add(f, "%q is a URL or a path: write the host name alone", h)
		case strings.Contains(h, "*"):
			add(f, "%q: wildcards are not supported; list each host", h)
		case net.ParseIP(strings.Trim(h, "[]")) != nil:
			add(f, "%q is an address: gauntlet allows named hosts only", h)
		case strings.Contains(h, ":"):
			add(f, "%q: no port; allowed hosts are reached over HTTP on port 80", h)
		case h != strings.ToLower(h):
			add(f, "%q: write host names in lower case", h)
		case !hostNameRE.MatchString(h) || len(h) > 253 || strings.Trim(h[strings.LastIndexByte(h, '.')+1:], "0123456789") == "":
			add(f, "%q is not a DNS host name", h)
		case h == "localhost" || h == "sandbox":
			add(f, "%q names the sandbox itself", h)
		case seen[h]:
			add(f, "%q appears twice", h)
		}
		seen[h] = true
	}
	e.AllowedHosts = r.AllowedHosts
}

// hostNameRE is a DNS host name: dot-separated labels of lower-case letters, digits and
// '-' (not at a label's ends), each at most 63 long.
var hostNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$`)

// imageRefRE accepts the shape of a Docker image reference: an optional registry host,
// path components, an optional tag and an optional digest.
var imageRefRE = regexp.MustCompile(`^([a-zA-Z0-9.-]+(:[0-9]+)?/)?[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$`)

// parseSizeMB reads a size of the deprecated memory/storage keys ("512M", "2G", "1T";
// binary units) as megabytes.
func parseSizeMB(s string) (int, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, errors.New(`empty size (want a number and a unit: "512M", "2G")`)
	}
	mult := 0
	switch strings.ToUpper(t[len(t)-1:]) {
	case "M":
		mult = 1
	case "G":
		mult = 1024
	case "T":
		mult = 1024 * 1024
	default:
		return 0, fmt.Errorf(`%q has no unit (want M, G or T: "512M", "2G")`, s)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(t[:len(t)-1]), 10, 64)
	if err != nil || n <= 0 || n > math.MaxInt32/int64(mult) {
		return 0, fmt.Errorf("%q is not a positive whole size", s)
	}
	return int(n) * mult, nil
}
