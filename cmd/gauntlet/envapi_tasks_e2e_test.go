package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
)

// taskEpisodesEnv sets how many episodes TestEnvAPITaskEpisodes plays (default 20; the
// 200 of docs/benchmarks.md are run by hand with it).
const taskEpisodesEnv = "GAUNTLET_TASK_EPISODES"

// TestEnvAPITaskEpisodes drives task episodes (env tasks, datasets/gauntlet, the process
// runtime) through the env API with the Python client and a scripted policy
// (examples/tasks_scripted.py: a look around, the task's solution, submit): each reset
// picks its task by id or by seed and returns the instruction, the solution passes the
// verifier wherever no fault was injected, and every step of every episode is in
// ClickHouse exactly once, with the episode's verdict.
func TestEnvAPITaskEpisodes(t *testing.T) {
	n := 20
	if v := os.Getenv(taskEpisodesEnv); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", taskEpisodesEnv, v)
		}
	}
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is required for the Python client: %v", err)
	}
	dataset, err := filepath.Abs("../../datasets/gauntlet")
	if err != nil {
		t.Fatal(err)
	}
	s, cfg := envAPIStackWith(t, func(c *config) {
		c.Sandbox = sandboxConfig(t, runtimes.Process)
		if err := c.Tasks.Datasets.Set("gauntlet=" + dataset); err != nil {
			t.Fatal(err)
		}
	})
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)

	// A reset whose filter selects nothing is the trainer's mistake, named.
	code, _, body := jsonCall(t, s.app.envapi.Addr(), tokenAcme, "Reset", `{"env":"tasks","paramsJson":"{\"dataset\":\"gauntlet\",\"tags\":[\"python\"],\"difficulty\":[\"hard\"]}"}`)
	if msg := fmt.Sprint(body["message"]); code != http.StatusBadRequest || !strings.Contains(msg, `selects none of the 32 tasks of dataset gauntlet`) {
		t.Errorf("Reset over an empty selection: %d %v", code, body)
	}

	t0 := time.Now()
	cmd := exec.Command(py, filepath.Join("..", "..", "examples", "tasks_scripted.py"),
		"--dataset", "gauntlet", "--dir", dataset, "--episodes", strconv.Itoa(n), "--workers", "4")
	cmd.Env = append(os.Environ(), "GAUNTLET_URL=http://"+s.app.envapi.Addr(), "GAUNTLET_TOKEN="+tokenAcme)
	out, err := cmd.Output()
	wall := time.Since(t0)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("examples/tasks_scripted.py: %v\n%s\n%s", err, out, stderr)
	}
	t.Logf("%s (%d episodes in %v)", lines[len(lines)-1], n, wall.Round(time.Millisecond))
	type episode struct {
		ID, Task, By string
		Steps        int
		Pass         bool
	}
	played := map[string]episode{}
	var ids []string
	byID, bySeed := 0, 0
	for _, l := range lines[:len(lines)-1] {
		var e struct {
			EpisodeID string `json:"episode_id"`
			Task      string `json:"task"`
			By        string `json:"by"`
			Steps     int    `json:"steps"`
			Pass      bool   `json:"pass"`
		}
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("a line of the script's output: %v: %s", err, l)
		}
		played[e.EpisodeID] = episode{ID: e.EpisodeID, Task: e.Task, By: e.By, Steps: e.Steps, Pass: e.Pass}
		ids = append(ids, e.EpisodeID)
		if e.By == "id" {
			byID++
		} else {
			bySeed++
		}
	}
	if len(played) != n || byID == 0 || bySeed == 0 {
		t.Fatalf("the script played %d distinct episodes (%d by id, %d by seed), want %d", len(played), byID, bySeed, n)
	}
	waitEpisodes(t, conn, cfg.Database, ids)
	list := "'" + strings.Join(ids, "','") + "'"
	_, rows, err := trajectory.Query(t.Context(), conn, fmt.Sprintf(`SELECT e.episode_id, toString(e.steps), toString(e.success), toString(s.rows), toString(s.distinct), toString(s.last)
FROM %[1]s.episodes AS e FINAL
ANY LEFT JOIN (SELECT episode_id, count() AS rows, uniqExact(step) AS distinct, max(step) AS last FROM %[1]s.steps FINAL WHERE episode_id IN (%[2]s) GROUP BY episode_id) AS s USING episode_id
WHERE e.episode_id IN (%[2]s)`, cfg.Database, list))
	if err != nil || len(rows) != n {
		t.Fatalf("episodes and their steps: %d rows, %v", len(rows), err)
	}
	for _, r := range rows {
		e := played[r[0]]
		want := []string{r[0], strconv.Itoa(e.Steps), map[bool]string{true: "1", false: "0"}[e.Pass], strconv.Itoa(e.Steps), strconv.Itoa(e.Steps), strconv.Itoa(e.Steps - 1)}
		if strings.Join(r, " ") != strings.Join(want, " ") {
			t.Errorf("episode %s (task %s): recorded id, steps, success, step rows, distinct steps, last step = %v; want %v", r[0], e.Task, r, want)
		}
	}
}
