package codefix

import "fmt"

// HarborSeedBase is the seed the Harbor task folder of variant i is drawn from
// (HarborSeedBase+i): fixed, so the folders in datasets/ are reproducible byte for byte.
const HarborSeedBase = 1000

// harborCases is how many visible test cases a Harbor task folder has, the env's default.
const harborCases = 4

// HarborVariants are the names of the built-in bugs, in variant order: the task folders
// datasets/gauntlet/codefix/<name>.
func HarborVariants() []string {
	out := make([]string, len(variants))
	for i, v := range variants {
		out[i] = v.name
	}
	return out
}

// HarborTask returns the files of variant i's task folder in Harbor's format (path
// relative to the folder: content). The project goes to environment/app, which the
// Dockerfile copies to /app; the verifier (tests/test.sh) checks, as the env's own
// verifier does, that /app/tests holds exactly the original test file, that the visible
// tests pass, and that the hidden cases (tests/hidden.sh, never in the agent's /app)
// print exactly tests/hidden.expected; it writes 1 or 0 to /logs/verifier/reward.txt.
// Scripts (paths ending in .sh under tests/ and solution/) are meant to be executable.
func HarborTask(i int) map[string]string {
	t := newTask(HarborSeedBase+uint64(i), i, harborCases)
	v := t.v
	files := map[string]string{}
	for p, c := range t.files {
		files["environment/app/"+p] = c
	}
	files["environment/Dockerfile"] = "FROM debian:bookworm-slim\nWORKDIR /app\nCOPY app/ /app/\n"
	files["instruction.md"] = fmt.Sprintf("# Fix the shell library\n\n"+
		"The project in /app is a small shell library, src/lib.sh, with its tests in\n"+
		"tests/test_lib.sh. The tests fail: one function of the library has a bug.\n\n"+
		"%s\n\n"+
		"Find the bug and fix it in /app/src/lib.sh, so that `sh tests/test_lib.sh`, run from\n"+
		"/app, passes. The function must be correct for every input, not only for the cases\n"+
		"in the test file. Do not change anything under /app/tests.\n", v.summary)
	files["task.toml"] = fmt.Sprintf(`version = "1.0"

[metadata]
author_name = "gauntlet"
difficulty = "easy"
category = "debugging"
tags = ["shell", "codefix", "bugfix"]
codefix_variant = %q

[verifier]
timeout_sec = 60.0

[agent]
timeout_sec = 600.0

[environment]
build_timeout_sec = 600.0
cpus = 1
memory_mb = 512
storage_mb = 256
allow_internet = false
`, v.name)
	files["tests/test_lib.sh.orig"] = t.files[TestPath]
	files["tests/hidden.sh"] = "#!/bin/sh\n# Hidden cases of the verifier, run from /app; never in the agent's workspace.\n" + t.hiddenScript()
	files["tests/hidden.expected"] = t.expectedHidden()
	files["tests/test.sh"] = `#!/bin/bash
# Verifier: the test file unchanged, the visible tests passing, and the hidden cases
# printing exactly what a correct library prints. Writes 1 or 0 to reward.txt.
mkdir -p /logs/verifier
cd /app || { echo 0 > /logs/verifier/reward.txt; exit 0; }
reward=0
if [ "$(ls -A tests)" != "test_lib.sh" ] || ! cmp -s tests/test_lib.sh /tests/test_lib.sh.orig; then
	echo "tests/ was changed"
elif ! timeout 20 sh tests/test_lib.sh; then
	echo "the visible tests fail"
elif ! timeout 20 sh /tests/hidden.sh > /logs/verifier/hidden.out 2>/dev/null ||
	! cmp -s /logs/verifier/hidden.out /tests/hidden.expected; then
	echo "the hidden cases fail"
else
	reward=1
fi
echo "$reward" > /logs/verifier/reward.txt
`
	files["solution/solve.sh"] = "#!/bin/bash\n# Reference solution: the library with the bug fixed.\nset -e\ncat > /app/" + LibPath + " <<'GAUNTLET_EOF'\n" +
		t.fixedLib() + "GAUNTLET_EOF\n"
	return files
}
