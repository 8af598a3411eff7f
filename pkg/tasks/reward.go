package tasks

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// RewardName is the component name a reward.txt's single number is recorded under.
const RewardName = "reward"

// maxRewardBytes bounds a reward file: a verifier that writes megabytes there is broken.
const maxRewardBytes = 64 << 10

// ErrNoReward: the verifier wrote neither reward.txt nor reward.json. Harbor's format
// makes writing one the verifier's job, so this is the verifier failing, never a reward
// of 0.
var ErrNoReward = errors.New("the verifier wrote no reward.txt or reward.json")

// ParseRewardText reads reward.txt: one integer or float, surrounding white space allowed.
func ParseRewardText(data []byte) (float64, error) {
	s := strings.TrimSpace(string(data))
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("reward.txt: %q is not one finite number", truncate(s, 40))
	}
	return v, nil
}

// ParseRewardJSON reads reward.json: one object of named numbers ({"accuracy": 0.9}).
// Names must be non-empty and values finite numbers; anything else is refused.
func ParseRewardJSON(data []byte) (map[string]float64, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var raw map[string]any
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("reward.json: %w", err)
	}
	if dec.More() {
		return nil, errors.New("reward.json: more than one JSON value")
	}
	if len(raw) == 0 {
		return nil, errors.New("reward.json: no rewards in it")
	}
	out := make(map[string]float64, len(raw))
	for k, v := range raw {
		n, ok := v.(json.Number)
		if !ok {
			return nil, fmt.Errorf("reward.json: %q is not a number", k)
		}
		f, err := n.Float64()
		if err != nil || math.IsInf(f, 0) {
			return nil, fmt.Errorf("reward.json: %q: %s is not a finite number", k, n)
		}
		if strings.TrimSpace(k) == "" {
			return nil, errors.New("reward.json: a reward has an empty name")
		}
		out[k] = f
	}
	return out, nil
}

// ReadRewards reads the rewards the verifier left in dir (the host side of
// /logs/verifier): reward.txt when present, as {RewardName: value}, else reward.json, as
// Harbor reads them. Neither is ErrNoReward.
func ReadRewards(dir string) (map[string]float64, error) {
	data, err := readBounded(filepath.Join(dir, "reward.txt"))
	if err == nil {
		v, err := ParseRewardText(data)
		if err != nil {
			return nil, err
		}
		return map[string]float64{RewardName: v}, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	data, err = readBounded(filepath.Join(dir, "reward.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNoReward
	}
	if err != nil {
		return nil, err
	}
	return ParseRewardJSON(data)
}

// readBounded reads a regular file of at most maxRewardBytes; a symlink is refused, as
// the verifier's output could otherwise point the reader anywhere.
func readBounded(p string) ([]byte, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: %w", filepath.Base(p), ErrNotRegular)
	}
	if fi.Size() > maxRewardBytes {
		return nil, fmt.Errorf("%s: %d bytes, more than %d", filepath.Base(p), fi.Size(), maxRewardBytes)
	}
	return os.ReadFile(p)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
