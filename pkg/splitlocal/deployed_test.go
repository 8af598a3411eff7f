package splitlocal

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const deployDir = "../../deploy"

// targetOf is the --target of a gauntlet command line, "" when it has none.
func targetOf(args []string) string {
	for _, a := range args {
		if t, ok := strings.CutPrefix(a, "--target="); ok {
			return t
		}
	}
	return ""
}

// TestDeployMatchesTheFacts: deploy/compose and deploy/kubernetes run the targets of
// Deployed with its counts, on HTTPPort, with nats.replicas equal to the NATS servers they
// describe; Deployed names every target of Layout and no other.
func TestDeployMatchesTheFacts(t *testing.T) {
	var layout, deployed []string
	for _, tg := range Layout {
		layout = append(layout, tg.Name)
	}
	for name := range Deployed {
		deployed = append(deployed, name)
	}
	sort.Strings(layout)
	sort.Strings(deployed)
	if strings.Join(layout, ",") != strings.Join(deployed, ",") {
		t.Fatalf("Deployed names %v, Layout %v: every target of the split stack needs its row", deployed, layout)
	}
	compose := composeReplicas(t)
	kube := kubernetesReplicas(t)
	for name, want := range Deployed {
		if got := compose[name]; got != want.Compose {
			t.Errorf("deploy/compose runs %d of --target=%s, Deployed says %d", got, name, want.Compose)
		}
		if got := kube[name]; got != want.Kubernetes {
			t.Errorf("deploy/kubernetes runs %d of --target=%s, Deployed says %d", got, name, want.Kubernetes)
		}
		delete(compose, name)
		delete(kube, name)
	}
	for name := range compose {
		t.Errorf("deploy/compose runs --target=%s, which Deployed does not name", name)
	}
	for name := range kube {
		t.Errorf("deploy/kubernetes runs --target=%s, which Deployed does not name", name)
	}

	// Stream replicas follow the NATS servers each deployment describes.
	values := readYAML(t, "kubernetes/nats/values.yaml")[0]
	if got := dig(values, "config", "cluster", "replicas"); got != NATSNodes {
		t.Errorf("kubernetes/nats/values.yaml: cluster replicas %v, want %d", got, NATSNodes)
	}
	if got := readYAML(t, "kubernetes/gauntlet.yaml")[0]["nats.replicas"]; got != StreamReplicas {
		t.Errorf("kubernetes/gauntlet.yaml: nats.replicas %v, want %d", got, StreamReplicas)
	}
	if got := readYAML(t, "compose/gauntlet.yaml")[0]["nats.replicas"]; got != ComposeStreamReplicas {
		t.Errorf("compose/gauntlet.yaml: nats.replicas %v, want %d", got, ComposeStreamReplicas)
	}
	want := "0.0.0.0:" + strconv.Itoa(HTTPPort)
	for _, f := range []string{"kubernetes/gauntlet.yaml", "compose/gauntlet.yaml"} {
		if got := readYAML(t, f)[0]["http"]; got != want {
			t.Errorf("%s: http %v, want %s", f, got, want)
		}
	}
}

// composeReplicas counts the gauntlet containers of deploy/compose by target.
func composeReplicas(t *testing.T) map[string]int {
	t.Helper()
	doc := readYAML(t, "compose/compose.yaml")[0]
	services, _ := doc["services"].(map[string]any)
	out := map[string]int{}
	for name, v := range services {
		svc, _ := v.(map[string]any)
		if _, onDemand := svc["profiles"]; onDemand {
			continue
		}
		target := targetOf(strings_(svc["command"]))
		if target == "" {
			continue
		}
		n := 1
		if r, ok := dig(svc, "deploy", "replicas").(int); ok {
			n = r
		}
		if strings_(svc["command"])[0] != "serve" {
			t.Errorf("compose service %s: command %v does not run gauntlet serve", name, svc["command"])
		}
		out[target] += n
	}
	return out
}

// kubernetesReplicas counts the gauntlet pods of deploy/kubernetes by target: a
// Deployment's replicas, or its HorizontalPodAutoscaler's minReplicas. Every Deployment
// must listen on HTTPPort.
func kubernetesReplicas(t *testing.T) map[string]int {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(deployDir, "kubernetes", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]string{} // Deployment name -> target
	replicas := map[string]int{}
	hpaMin := map[string]int{}
	for _, f := range files {
		rel, _ := filepath.Rel(deployDir, f)
		for _, doc := range readYAML(t, rel) {
			name, _ := dig(doc, "metadata", "name").(string)
			switch doc["kind"] {
			case "Deployment":
				containers, _ := dig(doc, "spec", "template", "spec", "containers").([]any)
				for _, c := range containers {
					cm, _ := c.(map[string]any)
					target := targetOf(strings_(cm["args"]))
					if target == "" {
						continue
					}
					targets[name] = target
					if r, ok := dig(doc, "spec", "replicas").(int); ok {
						replicas[name] = r
					}
					ports, _ := cm["ports"].([]any)
					found := false
					for _, p := range ports {
						if pm, _ := p.(map[string]any); pm["containerPort"] == HTTPPort {
							found = true
						}
					}
					if !found {
						t.Errorf("%s: Deployment %s does not expose port %d", rel, name, HTTPPort)
					}
				}
			case "HorizontalPodAutoscaler":
				ref, _ := dig(doc, "spec", "scaleTargetRef", "name").(string)
				if m, ok := dig(doc, "spec", "minReplicas").(int); ok {
					hpaMin[ref] = m
				}
			}
		}
	}
	out := map[string]int{}
	for dep, target := range targets {
		n, hasReplicas := replicas[dep]
		m, hasHPA := hpaMin[dep]
		switch {
		case hasReplicas && hasHPA:
			t.Errorf("Deployment %s has both replicas and an HPA: the HPA owns the count", dep)
		case hasHPA:
			n = m
		case !hasReplicas:
			n = 1
		}
		out[target] += n
	}
	return out
}

// readYAML reads every document of a file under deploy/.
func readYAML(t *testing.T, rel string) []map[string]any {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(deployDir, rel))
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	var docs []map[string]any
	for {
		var doc map[string]any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		if doc != nil {
			docs = append(docs, doc)
		}
	}
	if len(docs) == 0 {
		t.Fatalf("%s: no YAML document", rel)
	}
	return docs
}

// dig walks maps by keys; nil when a step is missing.
func dig(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// strings_ is a YAML list of strings.
func strings_(v any) []string {
	l, _ := v.([]any)
	out := make([]string, 0, len(l))
	for _, s := range l {
		str, _ := s.(string)
		out = append(out, str)
	}
	return out
}
