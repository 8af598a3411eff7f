package codefix

import (
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite datasets/gauntlet/codefix from HarborTask")

// harborDir is where the codefix task folders live in the repository.
var harborDir = filepath.Join("..", "..", "..", "datasets", "gauntlet", "codefix")

// TestHarborDatasetUpToDate: the codefix folders in datasets/ are exactly what HarborTask
// makes of each built-in bug (contents and execute bits), so the env and the dataset never
// drift apart. Run with -update to rewrite them.
func TestHarborDatasetUpToDate(t *testing.T) {
	for i, name := range HarborVariants() {
		dir := filepath.Join(harborDir, name)
		files := HarborTask(i)
		if *update {
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			for rel, content := range files {
				p := filepath.Join(dir, filepath.FromSlash(rel))
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(content), harborMode(rel)); err != nil {
					t.Fatal(err)
				}
			}
		}
		seen := map[string]bool{}
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(dir, p)
			rel = filepath.ToSlash(rel)
			seen[rel] = true
			want, ok := files[rel]
			if !ok {
				t.Errorf("%s/%s: not made by HarborTask (run go test ./pkg/env/codefix -run HarborDataset -update)", name, rel)
				return nil
			}
			got, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if string(got) != want {
				t.Errorf("%s/%s differs from HarborTask (run with -update)", name, rel)
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			if exec := info.Mode().Perm()&0o111 != 0; exec != (harborMode(rel)&0o111 != 0) {
				t.Errorf("%s/%s: executable %v", name, rel, exec)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for rel := range files {
			if !seen[rel] {
				t.Errorf("%s/%s: missing from datasets/ (run with -update)", name, rel)
			}
		}
		if strings.Contains(files["environment/app/"+LibPath], "GAUNTLET_EOF") {
			t.Errorf("%s: the library holds solve.sh's here-document marker", name)
		}
	}
}

// harborMode is a task file's mode: scripts of the verifier and the solution are
// executable, the rest is not.
func harborMode(rel string) os.FileMode {
	if strings.HasSuffix(rel, ".sh") && (strings.HasPrefix(rel, "tests/") || strings.HasPrefix(rel, "solution/")) {
		return 0o755
	}
	return 0o644
}
