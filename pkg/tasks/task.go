package tasks

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"
)

// The files and folders of a task, relative to its folder.
const (
	ConfigFile      = "task.toml"
	InstructionFile = "instruction.md"
	EnvironmentDir  = "environment"
	Dockerfile      = "environment/Dockerfile"
	TestsDir        = "tests"
	TestScript      = "tests/test.sh"
	SolutionDir     = "solution"
	SolutionScript  = "solution/solve.sh"
)

// Paths inside the sandbox that Harbor's format fixes: test.sh writes the reward under
// VerifierLogsDir; tests/ and solution/ are copied to TestsMount and SolutionMount only
// when the verifier or the oracle runs.
const (
	VerifierLogsDir = "/logs/verifier"
	AgentLogsDir    = "/logs/agent"
	RewardText      = VerifierLogsDir + "/reward.txt"
	RewardJSON      = VerifierLogsDir + "/reward.json"
	TestsMount      = "/tests"
	SolutionMount   = "/solution"
)

// maxInstructionBytes bounds instruction.md: it goes to the agent whole, in every reset.
const maxInstructionBytes = 1 << 20

// Task is one task folder, read and checked.
type Task struct {
	// ID names the task in its dataset: its folder relative to the dataset root, with
	// forward slashes ("codefix/sum"). A task loaded on its own has its folder's name.
	ID string
	// Dir is the task's folder (absolute).
	Dir string
	// Instruction is instruction.md, the agent's brief.
	Instruction string
	Config      Config
	// Environment is how the sandbox's image is made.
	Environment Environment
	// HasSolution is whether solution/solve.sh exists (the oracle can run the task).
	HasSolution bool
	// Digest is the folder's content digest (see Digest).
	Digest string
}

// Environment says where a task's image comes from: a prebuilt Image, or Dockerfile built
// with Context as its build context. When both are given the image is used, as in Harbor.
type Environment struct {
	// Image is [environment].docker_image, "" when the task builds its own.
	Image string
	// Dockerfile is the absolute path of environment/Dockerfile, "" when there is none.
	Dockerfile string
	// Context is the absolute path of environment/, the build context.
	Context string
}

// Name is the task's display name: [task].name when set, else its ID.
func (t *Task) Name() string {
	if t.Config.Task.Name != "" {
		return t.Config.Task.Name
	}
	return t.ID
}

// Load reads the task folder dir, naming it id in errors (its base name when id is "").
// The error joins a *FieldError for every problem found.
func Load(dir, id string) (*Task, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("load task %s: %w", dir, err)
	}
	if id == "" {
		id = filepath.Base(abs)
	}
	var errs []error
	add := func(field string, err error) {
		errs = append(errs, &FieldError{Task: id, Field: field, Err: err})
	}
	t := &Task{ID: id, Dir: abs}

	if fi, err := os.Stat(abs); err != nil {
		return nil, &FieldError{Task: id, Err: err}
	} else if !fi.IsDir() {
		return nil, &FieldError{Task: id, Err: errors.New("not a folder")}
	}

	if data, ok := readRegular(abs, ConfigFile, add); ok {
		c, err := ParseConfig(data)
		for _, p := range Problems(err) {
			var fe *FieldError
			if errors.As(p, &fe) {
				fe.Task = id
				if fe.Field == "" {
					fe.Field = ConfigFile
				}
			}
			errs = append(errs, p)
		}
		t.Config = c
	}

	if data, ok := readRegular(abs, InstructionFile, add); ok {
		switch {
		case len(data) > maxInstructionBytes:
			add(InstructionFile, fmt.Errorf("%d bytes, more than the %d an instruction may have", len(data), maxInstructionBytes))
		case !utf8.Valid(data):
			add(InstructionFile, errors.New("not UTF-8 text"))
		case strings.TrimSpace(string(data)) == "":
			add(InstructionFile, errors.New("empty"))
		default:
			t.Instruction = string(data)
		}
	}

	// test.sh's mode does not matter: the verifier runs it with bash, as Harbor does.
	statRegular(abs, TestScript, add)
	if _, err := os.Lstat(filepath.Join(abs, SolutionDir)); err == nil {
		// A solution folder without solve.sh would leave the oracle nothing to run.
		_, t.HasSolution = statRegular(abs, SolutionScript, add)
	}

	t.Environment.Context = filepath.Join(abs, EnvironmentDir)
	fi, err := os.Lstat(t.Environment.Context)
	switch {
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		add(EnvironmentDir, err)
	case err == nil && !fi.IsDir():
		add(EnvironmentDir, errors.New("not a folder"))
	}
	hasDockerfile := false
	if err == nil && fi.IsDir() {
		if _, err := os.Lstat(filepath.Join(abs, Dockerfile)); err == nil {
			_, hasDockerfile = statRegular(abs, Dockerfile, add)
		}
		for _, compose := range []string{"docker-compose.yaml", "docker-compose.yml"} {
			if _, err := os.Lstat(filepath.Join(t.Environment.Context, compose)); err == nil {
				add(EnvironmentDir+"/"+compose, fmt.Errorf("multi-container environments are %w", ErrUnsupported))
			}
		}
	}
	if hasDockerfile {
		t.Environment.Dockerfile = filepath.Join(abs, Dockerfile)
	}
	t.Environment.Image = t.Config.Environment.DockerImage
	if !hasDockerfile && t.Environment.Image == "" {
		add(EnvironmentDir, fmt.Errorf("%w: neither environment/Dockerfile nor [environment].docker_image", ErrMissing))
	}
	if _, err := os.Lstat(filepath.Join(abs, "steps")); err == nil {
		add("steps", fmt.Errorf("multi-step tasks are %w", ErrUnsupported))
	}

	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	d, err := Digest(abs)
	if err != nil {
		return nil, &FieldError{Task: id, Err: err}
	}
	t.Digest = d
	return t, nil
}

// readRegular reads the regular file rel of dir, reporting through add when it is missing
// or not a regular file.
func readRegular(dir, rel string, add func(string, error)) ([]byte, bool) {
	if _, ok := statRegular(dir, rel, add); !ok {
		return nil, false
	}
	data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(rel)))
	if err != nil {
		add(rel, err)
		return nil, false
	}
	return data, true
}

// statRegular checks that rel of dir is a regular file, not a symlink: a task folder is
// copied into sandboxes as it is, and a link could point anywhere on the host.
func statRegular(dir, rel string, add func(string, error)) (fs.FileInfo, bool) {
	fi, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(rel)))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		add(rel, ErrMissing)
		return nil, false
	case err != nil:
		add(rel, err)
		return nil, false
	case !fi.Mode().IsRegular():
		add(rel, fmt.Errorf("%w (%s)", ErrNotRegular, fi.Mode().Type()))
		return nil, false
	}
	return fi, true
}
