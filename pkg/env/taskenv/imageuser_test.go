package taskenv_test

import (
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/taskenv"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
	"github.com/gauntlet-rl/gauntlet/pkg/tasks"
)

// TestImageUserAndWorkDir: a task image's USER and WORKDIR hold as Docker applies them,
// on both runtimes: the agent's commands, the oracle's solve.sh and the verifier's
// test.sh run as the image's user (a name from the image's /etc/passwd with its primary
// group; a bare uid with group 0, as Docker gives it) in the image's WORKDIR, which the
// first observation names; what the agent writes there is the user's and reaches the
// verifier, which still writes /logs/verifier. A task's agent.user replaces the USER for
// the agent and solve.sh, its verifier.user for test.sh; with agent.user alone test.sh
// runs as the image's default user, not the agent's.
func TestImageUserAndWorkDir(t *testing.T) {
	if testing.Short() {
		t.Skip("builds task images and runs containerd; -short runs unit tests only")
	}
	cases := []userCase{
		{
			name: "named user",
			dockerfile: "FROM debian:bookworm-slim\n" +
				"RUN echo 'builder:x:1234:2345::/home/builder:/bin/sh' >> /etc/passwd && echo 'builders:x:2345:' >> /etc/group && " +
				"mkdir -p /srv/project && echo seeded > /srv/project/seed.txt && chown -R 1234:2345 /srv/project\n" +
				"WORKDIR /srv/project\nUSER builder\n",
			uid: "1234", gid: "2345", user: "builder", workdir: "/srv/project",
		},
		{
			name: "numeric uid",
			dockerfile: "FROM debian:bookworm-slim\n" +
				"WORKDIR /app\nRUN echo seeded > seed.txt && chmod 0777 /app\nUSER 4321\n",
			uid: "4321", gid: "0", workdir: "/app",
		},
		{
			// agent.user and verifier.user over the image's USER: the agent and solve.sh
			// run as the one, test.sh as the other.
			name: "agent.user and verifier.user",
			dockerfile: "FROM debian:bookworm-slim\n" +
				"RUN echo 'builder:x:1234:2345::/home/builder:/bin/sh' >> /etc/passwd && " +
				"mkdir -p /srv/project && echo seeded > /srv/project/seed.txt && chmod 0777 /srv/project\n" +
				"WORKDIR /srv/project\nUSER builder\n",
			agentUser: "4321", verifierUser: "root",
			uid: "4321", gid: "0", workdir: "/srv/project",
			verifier: func(string) (string, string) { return "0:0", "" },
		},
		{
			// agent.user alone: the verifier runs as the image's default, as in Harbor,
			// not as the agent.
			name: "agent.user alone",
			dockerfile: "FROM debian:bookworm-slim\n" +
				"RUN echo 'builder:x:1234:2345::/home/builder:/bin/sh' >> /etc/passwd && echo 'builders:x:2345:' >> /etc/group\n" +
				"WORKDIR /app\nRUN echo seeded > seed.txt && chmod 0777 /app\n",
			agentUser: "builder",
			uid:       "1234", gid: "2345", user: "builder", workdir: "/app",
			verifier: func(rt string) (string, string) {
				if rt == runtimes.Process {
					return "1000:1000", "" // the process runtime's own user without a USER
				}
				return "0:0", ""
			},
		},
	}
	images := runtimestest.Images(t)
	for _, rt := range []string{runtimes.Process, runtimes.Containerd} {
		t.Run(rt, func(t *testing.T) {
			c := runtimestest.Config(t, rt)
			c.Images = images
			sb := runtimestest.OpenConfig(t, c)
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					imageUserAndWorkDir(t, sb, tc)
				})
			}
		})
	}
}

// userCase is a task image with a USER or not, the task's agent.user and verifier.user,
// and who the agent and the verifier run as.
type userCase struct {
	name, dockerfile        string
	agentUser, verifierUser string // task.toml's
	uid, gid                string // the agent's
	user                    string // the agent's id -un; "" when the image names no such user
	workdir                 string
	// verifier is the verifier's "uid:gid" on a runtime, and the uid it sees owning the
	// solution's file ("" for the agent's uid on containerd, the verifier's on process,
	// where one host id owns the sandbox's files whoever runs); nil: the agent's.
	verifier func(rt string) (ids, owner string)
}

func imageUserAndWorkDir(t *testing.T, sb env.Sandboxes, tc userCase) {
	uid, gid, user, workdir := tc.uid, tc.gid, tc.user, tc.workdir
	ids, owner := uid+":"+gid, uid
	if tc.verifier != nil {
		ids, owner = tc.verifier(sb.Runtime().Name())
		if owner == "" {
			owner = uid
			if sb.Runtime().Name() == runtimes.Process {
				owner, _, _ = strings.Cut(ids, ":")
			}
		}
	}
	// test.sh passes only if it runs as the verifier's user, in the WORKDIR, and finds what
	// the agent and the solution wrote there, owned by the agent's user.
	check := `[ "$(id -u):$(id -g)" = "` + ids + `" ] && [ -f seed.txt ] && [ "$(cat agent.txt)" = agent ] && ` +
		`[ "$(cat solved.txt)" = solved ] && [ "$(stat -c %u solved.txt)" = ` + owner + ` ]`
	dir := writeTask(t, "#!/bin/bash\nif "+check+"; then echo 1 > /logs/verifier/reward.txt; else id; pwd; ls -ln; echo 0 > /logs/verifier/reward.txt; fi\n", "30.0")
	toml := "version = \"1.0\"\n[verifier]\ntimeout_sec = 30.0\n"
	if tc.verifierUser != "" {
		toml += "user = \"" + tc.verifierUser + "\"\n"
	}
	toml += "[agent]\ntimeout_sec = 60.0\n"
	if tc.agentUser != "" {
		toml += "user = \"" + tc.agentUser + "\"\n"
	}
	for p, c := range map[string]string{
		"task.toml":              toml,
		"environment/Dockerfile": tc.dockerfile,
		"solution/solve.sh":      "#!/bin/bash\necho solved > solved.txt\n",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(c), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ds, p := own(dir)
	ep, err := taskenv.New().NewEpisode(env.Config{Seed: 1, Params: p, Sandboxes: sb, Datasets: ds})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Close(ep) })
	first, err := ep.Reset()
	if err != nil {
		t.Fatal(err)
	}
	var obs0 struct {
		WorkDir string `json:"workdir"`
	}
	if err := json.Unmarshal(first, &obs0); err != nil || obs0.WorkDir != workdir {
		t.Errorf("first observation's workdir = %q (%v), want the image's WORKDIR %s", obs0.WorkDir, err, workdir)
	}
	res, err := ep.Step(act(tools.ShellExec, map[string]string{"command": `id -u; id -g; { getent passwd "$(id -u)" || echo -; } | cut -d: -f1; pwd; cat seed.txt; echo agent > agent.txt`}))
	if err != nil {
		t.Fatal(err)
	}
	var obs struct {
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
	}
	_ = json.Unmarshal(res.Observation, &obs)
	name := user
	if name == "" {
		name = "-"
		if sb.Runtime().Name() == runtimes.Process {
			name = "user" + uid // the process runtime's /etc/passwd names every user
		}
	}
	// pwd names the folder through the workspace, which the WORKDIR's top folder leads to.
	if want := uid + "\n" + gid + "\n" + name + "\n" + sandbox.WorkspacePath + workdir + "\nseeded\n"; obs.ExitCode != 0 || obs.Stdout != want {
		t.Errorf("the agent's command: %s; want exit 0 and stdout %q", res.Observation, want)
	}
	solve, err := taskenv.New().(env.Oracle).Oracle(0).Act(env.Turn{Observation: first})
	if err != nil {
		t.Fatal(err)
	}
	if res, err = ep.Step(solve); err != nil {
		t.Fatal(err)
	}
	if _ = json.Unmarshal(res.Observation, &obs); obs.ExitCode != 0 {
		t.Errorf("the solution: %s", res.Observation)
	}
	res, err = ep.Step(env.Action{Tool: taskenv.ToolSubmit})
	if v := verdictOf(t, step{res: res, err: err}); !v.Pass {
		t.Errorf("verdict %+v", v)
	}
}

// TestWorkDir: where an image's WORKDIR makes commands run, and what the sandbox then
// keeps for the verifier.
func TestWorkDir(t *testing.T) {
	harbor := map[string]string{"/app": "app", "/logs": "logs", "/tests": "tests", "/solution": "solution"}
	for _, c := range []struct {
		wd, want string
		link     string // the link added, "" for none
		err      bool
	}{
		{wd: "", want: "/app"},
		{wd: "/", want: "/app"},
		{wd: "/app", want: "/app"},
		{wd: "/app/src/", want: "/app/src"},
		{wd: "/workspace/x", want: "/workspace/x"},
		{wd: "/srv/project", want: "/srv/project", link: "/srv"},
		{wd: "/project", want: "/project", link: "/project"},
		{wd: "/usr/src/app", err: true},
		{wd: "/tmp", err: true},
		{wd: "/logs/agent", err: true},
		{wd: "/tests", err: true},
	} {
		spec := sandbox.Spec{Links: maps.Clone(harbor)}
		got, err := taskenv.WorkDirFor(&spec, c.wd)
		want := maps.Clone(harbor)
		if c.link != "" {
			want[c.link] = c.link[1:]
		}
		switch {
		case c.err && !errors.Is(err, taskenv.ErrWorkDir):
			t.Errorf("WORKDIR %q: %q, %v; want ErrWorkDir", c.wd, got, err)
		case !c.err && (err != nil || got != c.want):
			t.Errorf("WORKDIR %q: %q, %v; want %q", c.wd, got, err, c.want)
		case !maps.Equal(spec.Links, func() map[string]string {
			if c.err {
				return harbor
			}
			return want
		}()):
			t.Errorf("WORKDIR %q: links %v", c.wd, spec.Links)
		}
	}
}

// TestVerifierUserRefused: a task whose verifier must run as another user than the agent
// (verifier.user, or agent.user replacing the image's USER) is refused, naming the task
// and the field, on a runtime whose forks cannot change user, rather than its test.sh
// running as the agent's user; on the runtimes, which can, it runs as the user named.
func TestVerifierUserRefused(t *testing.T) {
	rt := runtimestest.Open(t, runtimes.Process, 1).Runtime()
	noUser := struct{ sandbox.Runtime }{rt} // a Runtime and nothing more: no UserForker
	for _, c := range []struct {
		agent, verifier string
		set             bool
		field           string // refused naming it where forks cannot change user
	}{
		{},
		{verifier: "root", set: true, field: "verifier.user"},
		{agent: "agent", set: true, field: "agent.user"},
		{agent: "agent", verifier: "1234", set: true, field: "verifier.user"},
	} {
		task := &tasks.Task{ID: "users"}
		task.Config.Agent.User, task.Config.Verifier.User = c.agent, c.verifier
		set, user, err := taskenv.VerifierFor(rt, task)
		if err != nil || set != c.set || user != c.verifier {
			t.Errorf("agent.user %q, verifier.user %q: %v %q %v; want %v %q", c.agent, c.verifier, set, user, err, c.set, c.verifier)
		}
		_, _, err = taskenv.VerifierFor(noUser, task)
		switch {
		case c.field == "" && err != nil:
			t.Errorf("no users: %v", err)
		case c.field != "" && (!errors.Is(err, taskenv.ErrUser) || !strings.Contains(err.Error(), "task users: "+c.field)):
			t.Errorf("agent.user %q, verifier.user %q without UserForker: %v; want ErrUser naming task users and %s", c.agent, c.verifier, err, c.field)
		}
	}
}
