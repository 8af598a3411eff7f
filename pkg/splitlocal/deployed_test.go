package splitlocal

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/chlocal"
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

// TestDeployedClickHouseIsReplicated: deploy/compose and deploy/kubernetes run
// DeployedClickHouse replicas, each configured as a replica of the one-shard cluster the
// migrations recognise (cluster, shard and replica macros; the cluster's shard listing
// every replica), and gauntlet is given every replica, in order.
func TestDeployedClickHouseIsReplicated(t *testing.T) {
	// compose: the services running clickhouse-server, each naming itself in REPLICA.
	services, _ := readYAML(t, "compose/compose.yaml")[0]["services"].(map[string]any)
	var compose []string
	for name, v := range services {
		image, _ := dig(v, "image").(string)
		if !strings.HasPrefix(image, "clickhouse/clickhouse-server:") {
			continue
		}
		compose = append(compose, name)
		if got := dig(v, "environment", "REPLICA"); got != name {
			t.Errorf("compose service %s: REPLICA %v, want its own name (the {replica} macro and interserver host)", name, got)
		}
		mounts := strings.Join(strings_(dig(v, "volumes")), " ")
		for _, m := range []string{"./clickhouse/replica.xml:/etc/clickhouse-server/config.d/", "./clickhouse/users.xml:/etc/clickhouse-server/users.d/"} {
			if !strings.Contains(mounts, m) {
				t.Errorf("compose service %s does not mount %s", name, m)
			}
		}
	}
	sort.Strings(compose)
	if len(compose) != DeployedClickHouse.Compose {
		t.Errorf("deploy/compose runs %d ClickHouse replicas (%v), DeployedClickHouse says %d", len(compose), compose, DeployedClickHouse.Compose)
	}
	checkReplicas(t, "compose", compose, "compose/gauntlet.yaml", "compose/clickhouse/replica.xml")
	var stack struct {
		ClickHouse string `json:"clickhouse"`
	}
	raw, err := os.ReadFile(filepath.Join(deployDir, "compose/stack.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &stack); err != nil {
		t.Fatalf("compose/stack.json: %v", err)
	}
	if want := addrs(compose); stack.ClickHouse != want {
		t.Errorf("compose/stack.json: clickhouse %q, want %q", stack.ClickHouse, want)
	}

	// Kubernetes: the StatefulSet's pods under its headless Service.
	var kube []string
	for _, doc := range readYAML(t, "kubernetes/optional/clickhouse/clickhouse.yaml") {
		if doc["kind"] != "StatefulSet" || dig(doc, "metadata", "name") != "clickhouse" {
			continue
		}
		n, _ := dig(doc, "spec", "replicas").(int)
		svc, _ := dig(doc, "spec", "serviceName").(string)
		for i := range n {
			kube = append(kube, "clickhouse-"+strconv.Itoa(i)+"."+svc+".clickhouse.svc.cluster.local")
		}
	}
	if len(kube) != DeployedClickHouse.Kubernetes {
		t.Errorf("deploy/kubernetes/optional/clickhouse runs %d ClickHouse replicas, DeployedClickHouse says %d", len(kube), DeployedClickHouse.Kubernetes)
	}
	checkReplicas(t, "kubernetes", kube, "kubernetes/gauntlet.yaml", "kubernetes/optional/clickhouse/replica.xml")
}

// addrs is the --clickhouse value naming hosts on the native port.
func addrs(hosts []string) string {
	out := make([]string, len(hosts))
	for i, h := range hosts {
		out[i] = h + ":9000"
	}
	return strings.Join(out, ",")
}

// checkReplicas checks one deployment: its gauntlet.yaml gives gauntlet exactly hosts,
// and its replica.xml declares the macros the migrations need and a shard of exactly
// hosts.
func checkReplicas(t *testing.T, deployment string, hosts []string, gauntletYAML, replicaXML string) {
	t.Helper()
	if got, want := readYAML(t, gauntletYAML)[0]["clickhouse"], addrs(hosts); got != want {
		t.Errorf("%s: clickhouse %v, want every replica %q", gauntletYAML, got, want)
	}
	raw, err := os.ReadFile(filepath.Join(deployDir, replicaXML))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Macros struct {
			Cluster string `xml:"cluster"`
			Shard   string `xml:"shard"`
			Replica struct {
				FromEnv string `xml:"from_env,attr"`
			} `xml:"replica"`
		} `xml:"macros"`
		Shard []struct {
			InternalReplication bool     `xml:"internal_replication"`
			Hosts               []string `xml:"replica>host"`
		} `xml:"remote_servers>gauntlet>shard"`
		ZooKeeper []string `xml:"zookeeper>node>host"`
	}
	if err := xml.Unmarshal(raw, &cfg); err != nil {
		t.Fatalf("%s: %v", replicaXML, err)
	}
	if cfg.Macros.Cluster != chlocal.DefaultCluster || cfg.Macros.Shard == "" || cfg.Macros.Replica.FromEnv != "REPLICA" {
		t.Errorf("%s: macros %+v; want cluster %q, a shard, and the replica from $REPLICA", replicaXML, cfg.Macros, chlocal.DefaultCluster)
	}
	if len(cfg.ZooKeeper) == 0 {
		t.Errorf("%s: no Keeper (zookeeper) node: replicated tables need one", replicaXML)
	}
	if len(cfg.Shard) != 1 || !cfg.Shard[0].InternalReplication || strings.Join(cfg.Shard[0].Hosts, ",") != strings.Join(hosts, ",") {
		t.Errorf("%s: cluster %s is %+v; want one shard, internal_replication on, replicas %v (%s runs them)", replicaXML, chlocal.DefaultCluster, cfg.Shard, hosts, deployment)
	}
}
