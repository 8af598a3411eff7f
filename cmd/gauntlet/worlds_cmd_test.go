package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const bankFile = "../../pkg/env/world/builtin/bank.yaml"

func TestWorldsValidate(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("name: x\nservices: [a]\ncolour: red\ntools: []\nsuccess: 'true'\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if err := runMain(context.Background(), []string{"worlds", "validate", bankFile}, &out, &errb); err != nil {
		t.Fatalf("%v\n%s%s", err, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), bankFile+": ok: world bank, sha256:") || strings.Contains(out.String(), "built in") {
		t.Fatalf("got %q", out.String())
	}
	// A user's world named like a built-in env validates, with a warning that a
	// serving process would refuse it.
	src, err := os.ReadFile(bankFile)
	if err != nil {
		t.Fatal(err)
	}
	mine := filepath.Join(t.TempDir(), "shop.yaml")
	if err := os.WriteFile(mine, []byte(strings.Replace(string(src), "\nname: bank\n", "\nname: shop\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := runMain(context.Background(), []string{"worlds", "validate", mine}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), ": ok: world shop, sha256:") || !strings.Contains(out.String(), "--env.worlds would refuse it") {
		t.Fatalf("got %q", out.String())
	}
	out.Reset()
	err = runMain(context.Background(), []string{"worlds", "validate", bankFile, bad}, &out, &errb)
	if !errors.Is(err, errInvalidWorlds) {
		t.Fatalf("got %v", err)
	}
	if !strings.Contains(out.String(), bad+":3:1: colour: unknown key") || !strings.Contains(out.String(), bad+":4:8: tools: at least one tool") {
		t.Fatalf("got %q", out.String())
	}
}

func TestWorldsDescribeAndGraph(t *testing.T) {
	var out, errb bytes.Buffer
	if err := runMain(context.Background(), []string{"worlds", "describe", bankFile}, &out, &errb); err != nil {
		t.Fatal(err, errb.String())
	}
	for _, want := range []string{"world bank\n", "services: accounts, payments, fraud\n", "    rule daily_limit: sent_today + args.amount <= daily_limit\n", "oracle plan: 5 steps\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("describe lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := runMain(context.Background(), []string{"worlds", "graph", "--format", "dot", bankFile}, &out, &errb); err != nil {
		t.Fatal(err, errb.String())
	}
	if !strings.HasPrefix(out.String(), `digraph "bank" {`) {
		t.Fatalf("got %q", out.String())
	}
	if err := runMain(context.Background(), []string{"worlds", "graph", "--format", "svg", bankFile}, &out, &errb); !errors.Is(err, errUsage) {
		t.Fatalf("--format svg: got %v", err)
	}
}

// TestRunAndDemoTakeWorlds: run and demo both take --env.worlds (demo, which also has
// the serving flags, declares it once: it panicked on a flag defined twice).
func TestRunAndDemoTakeWorlds(t *testing.T) {
	for _, cmd := range []string{"run", "demo"} {
		var out, errb bytes.Buffer
		if err := runMain(context.Background(), []string{cmd, "-h"}, &out, &errb); !errors.Is(err, errUsage) {
			t.Fatalf("%s -h: %v", cmd, err)
		}
		if !strings.Contains(errb.String(), "-env.worlds") {
			t.Fatalf("%s -h does not offer --env.worlds:\n%s", cmd, errb.String())
		}
	}
}
