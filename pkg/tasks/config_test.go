package tasks

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// harborExample is the example task.toml of Harbor's task documentation (version 1.0).
const harborExample = `version = "1.0"

[metadata]
difficulty_explanation = "Trivial task for demonstration"
category = "programming"
tags = ["trivial"]

[[metadata.authors]]
name = "Steve Jobs"
email = "steve@apple.com"

[verifier]
timeout_sec = 120.0
env = { API_KEY = "sk-test-123" }

[agent]
timeout_sec = 120.0

[solution]
env = { API_KEY = "sk-test-123" }

[environment]
build_timeout_sec = 600.0
docker_image = "some-org/some-name:some-tag"
cpus = 1
memory_mb = 2048
storage_mb = 10240
gpus = 0
gpu_types = ["H100", "A100"]
allow_internet = true

[[environment.mcp_servers]]
name = "mcp-server"
transport = "streamable-http"
url = "http://mcp-server:8000/mcp"
`

// schema13Example has the [task] table of schema_version 1.1 and later, and the deprecated
// memory/storage spellings.
const schema13Example = `schema_version = "1.3"
source = "terminal-bench"

[task]
name = "acme/hello"
description = "A short description of the task"
authors = [{ name = "Ada", email = "ada@example.com" }]
keywords = ["trivial", "programming"]

[metadata]
difficulty = "easy"
author_name = "Grace"
tags = ["shell", "trivial"]
custom = { anything = [1, 2] }

[verifier]
timeout_sec = 30
user = "root"

[agent]
timeout_sec = 90.5
setup_timeout_sec = 10
user = "agent"

[environment]
memory = "4G"
storage = "512M"
allow_internet = false
`

func TestParseConfigHarborExamples(t *testing.T) {
	c, err := ParseConfig([]byte(harborExample))
	if err != nil {
		t.Fatalf("Harbor's own example: %v", err)
	}
	want := Config{
		Version: "1.0",
		Metadata: Metadata{
			Category: "programming", Tags: []string{"trivial"},
			Authors: []Author{{Name: "Steve Jobs", Email: "steve@apple.com"}},
			Extra:   map[string]any{"difficulty_explanation": "Trivial task for demonstration"},
		},
		Agent:    Agent{Timeout: 120 * time.Second},
		Verifier: Verifier{Timeout: 120 * time.Second, Env: map[string]string{"API_KEY": "sk-test-123"}},
		Solution: Solution{Env: map[string]string{"API_KEY": "sk-test-123"}},
		Environment: EnvironmentConfig{
			BuildTimeout: 600 * time.Second, DockerImage: "some-org/some-name:some-tag",
			CPUs: 1, MemoryMB: 2048, StorageMB: 10240, GPUTypes: []string{"H100", "A100"},
			AllowInternet: true, NetworkMode: NetworkPublic,
			MCPServers: []MCPServer{{Name: "mcp-server", Transport: "streamable-http", URL: "http://mcp-server:8000/mcp"}},
		},
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("got  %+v\nwant %+v", c, want)
	}

	c, err = ParseConfig([]byte(schema13Example))
	if err != nil {
		t.Fatalf("schema 1.3 example: %v", err)
	}
	if c.Version != "1.3" || c.Source != "terminal-bench" || c.Task.Name != "acme/hello" {
		t.Errorf("identity: %+v", c)
	}
	if c.Agent.Timeout != 90500*time.Millisecond || c.Agent.SetupTimeout != 10*time.Second || c.Verifier.Timeout != 30*time.Second {
		t.Errorf("timeouts: agent %v setup %v verifier %v", c.Agent.Timeout, c.Agent.SetupTimeout, c.Verifier.Timeout)
	}
	if c.Environment.MemoryMB != 4096 || c.Environment.StorageMB != 512 || c.Environment.AllowInternet {
		t.Errorf("environment: %+v", c.Environment)
	}
	if got := c.Tags(); !slices.Equal(got, []string{"shell", "trivial", "programming"}) {
		t.Errorf("Tags = %v", got)
	}
	if c.Metadata.Difficulty != "easy" || len(c.Metadata.Authors) != 1 || c.Metadata.Extra["custom"] == nil {
		t.Errorf("metadata: %+v", c.Metadata)
	}
}

func TestParseConfigDefaults(t *testing.T) {
	c, err := ParseConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Version != DefaultVersion || c.Agent.Timeout != DefaultTimeout || c.Verifier.Timeout != DefaultTimeout ||
		c.Environment.BuildTimeout != DefaultTimeout || c.Environment.CPUs != 1 || c.Environment.MemoryMB != 2048 ||
		c.Environment.StorageMB != 10240 || !c.Environment.AllowInternet {
		t.Errorf("defaults: %+v", c)
	}
}

// TestParseConfigRefuses: each bad task.toml gives a *FieldError naming every field at
// fault, not only the first.
func TestParseConfigRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, toml string
		fields     []string
		reason     string
	}{
		{"unknown top-level key", `colour = "red"`, []string{"colour"}, "unknown key"},
		{"unknown table key", "[verifier]\ntimeout_sec = 1\ntimeout = 5", []string{"verifier.timeout"}, "unknown key"},
		{"unknown table", "[steps]\nx = 1", []string{"steps"}, "unknown key"},
		{"negative timeout", "[agent]\ntimeout_sec = -1", []string{"agent.timeout_sec"}, "positive"},
		{"zero timeout", "[verifier]\ntimeout_sec = 0", []string{"verifier.timeout_sec"}, "positive"},
		{"nan timeout", "[verifier]\ntimeout_sec = nan", []string{"verifier.timeout_sec"}, "not a number"},
		{"inf timeout", "[environment]\nbuild_timeout_sec = inf", []string{"environment.build_timeout_sec"}, "not a number"},
		{"huge timeout", "[agent]\ntimeout_sec = 1e9", []string{"agent.timeout_sec"}, "longer than"},
		{"string timeout", "[agent]\ntimeout_sec = \"10m\"", []string{"agent.timeout_sec"}, "incompatible types"},
		{"every table reports", "[agent]\ntimeout_sec = \"x\"\n[verifier]\ntimeout_sec = -2\n[environment]\ncpus = 0\nbogus = 1",
			[]string{"agent.timeout_sec", "verifier.timeout_sec", "environment.cpus", "environment.bogus"}, ""},
		{"bad difficulty", "[metadata]\ndifficulty = \"trivial\"", []string{"metadata.difficulty"}, "not one of"},
		{"canary not a boolean", "[metadata]\ncanary = \"yes\"", []string{"metadata.canary"}, "must be a boolean"},
		{"tags not strings", "[metadata]\ntags = [1, \"a\"]", []string{"metadata.tags[0]"}, "must be a string"},
		{"empty tag", "[metadata]\ntags = [\"a\", \" \"]", []string{"metadata.tags[1]"}, "not a label"},
		{"control in keyword", "schema_version = \"1.3\"\n[task]\nkeywords = [\"a\\nb\"]", []string{"task.keywords[0]"}, "control"},
		{"author key", "[[metadata.authors]]\nname = \"a\"\nphone = \"1\"", []string{"metadata.authors[0].phone"}, "unknown key"},
		{"both versions", "version = \"1.0\"\nschema_version = \"1.3\"", []string{"schema_version"}, "both"},
		{"future version", "schema_version = \"2.0\"", []string{"schema_version"}, "unsupported"},
		{"bad image", "[environment]\ndocker_image = \"Not An Image\"", []string{"environment.docker_image"}, "image reference"},
		{"memory twice", "[environment]\nmemory = \"1G\"\nmemory_mb = 1024", []string{"environment.memory"}, "together"},
		{"bad memory", "[environment]\nmemory = \"lots\"", []string{"environment.memory"}, "no unit"},
		{"bad env name", "[verifier]\nenv = { \"1X\" = \"a\" }", []string{"verifier.env.1X"}, "variable name"},
		{"bad user", "[agent]\nuser = \"root; rm\"", []string{"agent.user"}, "user name"},
		{"bad mcp", "[[environment.mcp_servers]]\nname = \"m\"\ntransport = \"carrier-pigeon\"", []string{"environment.mcp_servers[0].transport"}, "not one of"},
		{"bad task name", "schema_version = \"1.3\"\n[task]\nname = \"hello world\"", []string{"task.name"}, "org"},
		{"syntax", "[agent\ntimeout_sec = 1", []string{""}, ""},
		{"bad network mode", "[environment]\nnetwork_mode = \"bridge\"", []string{"environment.network_mode"}, "not one of public, no-network, allowlist"},
		{"network mode and allow_internet", "[environment]\nnetwork_mode = \"no-network\"\nallow_internet = false", []string{"environment.allow_internet"}, "write only network_mode"},
		{"hosts without allowlist", "[environment]\nnetwork_mode = \"public\"\nallowed_hosts = [\"pypi.org\"]", []string{"environment.allowed_hosts"}, "only read with network_mode = \"allowlist\""},
		{"hosts by default mode", "[environment]\nallowed_hosts = [\"pypi.org\"]", []string{"environment.allowed_hosts"}, "this task's mode is \"public\""},
		{"bad hosts", "[environment]\nnetwork_mode = \"allowlist\"\nallowed_hosts = [\"https://pypi.org\", \"*.pypi.org\", \"10.0.0.1\", \"pypi.org:443\", \"PyPI.org\", \"-x.org\", \"1.2.3\", \"sandbox\", \"a.org\", \"a.org\"]",
			[]string{"environment.allowed_hosts[0]", "environment.allowed_hosts[1]", "environment.allowed_hosts[2]", "environment.allowed_hosts[3]", "environment.allowed_hosts[4]",
				"environment.allowed_hosts[5]", "environment.allowed_hosts[6]", "environment.allowed_hosts[7]", "environment.allowed_hosts[9]"}, "gauntlet allows named hosts only"},
		{"phase network overrides", "[agent]\nnetwork_mode = \"allowlist\"\nallowed_hosts = [\"pypi.org\"]\n[verifier]\nnetwork_mode = \"no-network\"",
			[]string{"agent.network_mode", "agent.allowed_hosts", "verifier.network_mode"}, "per-phase network policies are not supported by gauntlet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.toml))
			if err == nil {
				t.Fatal("accepted")
			}
			var got []string
			for _, p := range Problems(err) {
				var fe *FieldError
				if !errors.As(p, &fe) {
					t.Fatalf("problem %v is not a *FieldError", p)
				}
				got = append(got, fe.Field)
			}
			for _, f := range tc.fields {
				if !slices.Contains(got, f) {
					t.Errorf("fields %q, want %q among them (%v)", got, f, err)
				}
			}
			if len(got) != len(tc.fields) {
				t.Errorf("fields %q, want exactly %q (%v)", got, tc.fields, err)
			}
			if !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("error %q does not say %q", err, tc.reason)
			}
		})
	}
}

// TestParseConfigNetwork: Harbor's network_mode and allowed_hosts, and allow_internet as
// their deprecated spelling.
func TestParseConfigNetwork(t *testing.T) {
	for _, tc := range []struct {
		toml     string
		mode     string
		internet bool
		hosts    []string
	}{
		{"", NetworkPublic, true, nil},
		{"[environment]\nallow_internet = false", NetworkNone, false, nil},
		{"[environment]\nallow_internet = true", NetworkPublic, true, nil},
		{"[environment]\nnetwork_mode = \"no-network\"", NetworkNone, false, nil},
		{"[environment]\nnetwork_mode = \"allowlist\"", NetworkAllowlist, false, nil},
		{"[environment]\nnetwork_mode = \"allowlist\"\nallowed_hosts = [\"pypi.org\", \"releases.example.test\"]", NetworkAllowlist, false, []string{"pypi.org", "releases.example.test"}},
	} {
		c, err := ParseConfig([]byte(tc.toml))
		if err != nil {
			t.Fatalf("%q: %v", tc.toml, err)
		}
		e := c.Environment
		if e.NetworkMode != tc.mode || e.AllowInternet != tc.internet || !slices.Equal(e.AllowedHosts, tc.hosts) {
			t.Errorf("%q: mode %q internet %v hosts %q, want %q %v %q", tc.toml, e.NetworkMode, e.AllowInternet, e.AllowedHosts, tc.mode, tc.internet, tc.hosts)
		}
	}
}

func TestUnknownKeyIsSentinel(t *testing.T) {
	_, err := ParseConfig([]byte("[agent]\ntimeout = 5"))
	if !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("%v is not ErrUnknownKey", err)
	}
}

// FuzzParseConfig: no input makes the reader panic, and whatever it accepts obeys the
// invariants every later user of a Config relies on.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(harborExample))
	f.Add([]byte(schema13Example))
	f.Add([]byte("[agent]\ntimeout_sec = 1e-300"))
	f.Add([]byte("[environment]\nmemory = \"9999999999999G\""))
	f.Add([]byte("[metadata]\nauthors = [[1]]"))
	f.Add([]byte("[[metadata.authors]]\nname = 3"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err != nil {
			for _, p := range Problems(err) {
				var fe *FieldError
				if !errors.As(p, &fe) {
					t.Fatalf("problem %v is not a *FieldError", p)
				}
			}
			return
		}
		for _, d := range []time.Duration{c.Agent.Timeout, c.Verifier.Timeout, c.Environment.BuildTimeout} {
			if d <= 0 || d > MaxTimeout {
				t.Fatalf("accepted timeout %v", d)
			}
		}
		if c.Agent.SetupTimeout < 0 || c.Agent.SetupTimeout > MaxTimeout {
			t.Fatalf("accepted setup timeout %v", c.Agent.SetupTimeout)
		}
		if c.Environment.CPUs < 1 || c.Environment.MemoryMB < 1 || c.Environment.StorageMB < 1 || c.Environment.GPUs < 0 {
			t.Fatalf("accepted resources %+v", c.Environment)
		}
		if c.Metadata.Difficulty != "" && !slices.Contains(Difficulties, c.Metadata.Difficulty) {
			t.Fatalf("accepted difficulty %q", c.Metadata.Difficulty)
		}
		if !slices.Contains(supportedVersions, c.Version) {
			t.Fatalf("accepted version %q", c.Version)
		}
	})
}

// TestFreeTextLabels: tags are free text in Harbor's format; spaces, case and repeats are
// accepted, and Tags lists each once.
func TestFreeTextLabels(t *testing.T) {
	c, err := ParseConfig([]byte("[metadata]\ntags = [\"File Operations\", \"c++\", \"c++\"]"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Tags(); !slices.Equal(got, []string{"File Operations", "c++"}) {
		t.Errorf("Tags = %q", got)
	}
}
