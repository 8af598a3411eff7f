package tasks

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestReadRewards(t *testing.T) {
	for _, tc := range []struct {
		name      string
		txt, json *string
		want      map[string]float64
		wantErr   bool
		wantNoRwd bool
	}{
		{name: "txt one", txt: ptr("1\n"), want: map[string]float64{"reward": 1}},
		{name: "txt float", txt: ptr("  0.25 "), want: map[string]float64{"reward": 0.25}},
		{name: "txt wins over json", txt: ptr("0"), json: ptr(`{"a": 1}`), want: map[string]float64{"reward": 0}},
		{name: "json", json: ptr(`{"accuracy": 0.95, "runtime_sec": 1.23}`), want: map[string]float64{"accuracy": 0.95, "runtime_sec": 1.23}},
		{name: "txt words", txt: ptr("passed"), wantErr: true},
		{name: "txt two numbers", txt: ptr("1 1"), wantErr: true},
		{name: "txt nan", txt: ptr("NaN"), wantErr: true},
		{name: "txt empty", txt: ptr(""), wantErr: true},
		{name: "json string value", json: ptr(`{"a": "1"}`), wantErr: true},
		{name: "json empty", json: ptr(`{}`), wantErr: true},
		{name: "json array", json: ptr(`[1]`), wantErr: true},
		{name: "json two values", json: ptr(`{"a": 1} {"b": 2}`), wantErr: true},
		{name: "json huge", json: ptr(`{"a": 1e999}`), wantErr: true},
		{name: "nothing", wantNoRwd: true, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.txt != nil {
				must(t, os.WriteFile(filepath.Join(dir, "reward.txt"), []byte(*tc.txt), 0o644))
			}
			if tc.json != nil {
				must(t, os.WriteFile(filepath.Join(dir, "reward.json"), []byte(*tc.json), 0o644))
			}
			got, err := ReadRewards(dir)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, want error %v", err, tc.wantErr)
			}
			if tc.wantNoRwd != errors.Is(err, ErrNoReward) {
				t.Fatalf("err %v, ErrNoReward %v", err, tc.wantNoRwd)
			}
			if !tc.wantErr && !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestReadRewardsRefusesSymlink(t *testing.T) {
	dir := t.TempDir()
	must(t, os.Symlink("/etc/hostname", filepath.Join(dir, "reward.txt")))
	if _, err := ReadRewards(dir); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("symlinked reward.txt: %v", err)
	}
}

func ptr(s string) *string { return &s }
