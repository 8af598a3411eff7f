package chlocal

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/template"
)

// Files and folders under Options.Dir.
const (
	configFile   = "config.xml"
	usersFile    = "users.xml"
	pidFile      = "clickhouse.pid"
	logDir       = "log"
	serverLog    = "log/clickhouse-server.log"
	errorLog     = "log/clickhouse-server.err.log"
	stdoutLog    = "log/stdout.log"
	dataDir      = "data/"
	tmpDir       = "tmp/"
	userFilesDir = "user_files/"
	schemasDir   = "format_schemas/"
)

// configTemplate is deliberately small and uses only keys that ClickHouse 18.16 and
// current releases both accept, so the same file works whatever the package installs.
// Caches are sized for a 2-core development box instead of the packaged defaults
// (5 GiB of mark cache, 8 GiB of uncompressed cache).
var configTemplate = template.Must(template.New("config").Funcs(template.FuncMap{"x": xmlText}).Parse(
	`<?xml version="1.0"?>
<!-- Written by gauntlet's pkg/chlocal on every start: edits are overwritten. -->
<yandex>
    <logger>
        <level>warning</level>
        <log>{{x .ServerLog}}</log>
        <errorlog>{{x .ErrorLog}}</errorlog>
        <size>50M</size>
        <count>2</count>
    </logger>
    <listen_host>127.0.0.1</listen_host>
    <tcp_port>{{.TCPPort}}</tcp_port>
    <http_port>{{.HTTPPort}}</http_port>
    <path>{{x .Data}}</path>
    <tmp_path>{{x .Tmp}}</tmp_path>
    <user_files_path>{{x .UserFiles}}</user_files_path>
    <format_schema_path>{{x .Schemas}}</format_schema_path>
    <users_config>{{x .Users}}</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <timezone>UTC</timezone>
    <max_connections>256</max_connections>
    <max_concurrent_queries>32</max_concurrent_queries>
    <keep_alive_timeout>3</keep_alive_timeout>
    <mark_cache_size>67108864</mark_cache_size>
    <uncompressed_cache_size>67108864</uncompressed_cache_size>
    <mlock_executable>false</mlock_executable>
    <macros>
        <!-- Which server this is: the readiness probe asks for it (see instanceMacro). -->
        <gauntlet_instance>{{x .Instance}}</gauntlet_instance>
{{- with .Replication}}
        <cluster>{{x .Cluster}}</cluster>
        <shard>{{x .Shard}}</shard>
        <replica>{{x .Replica}}</replica>
{{- end}}
    </macros>
{{- with .Replication}}
    <!-- Replicated mode: one replica of a one-shard cluster (docs/architecture.md). -->
    <interserver_http_host>127.0.0.1</interserver_http_host>
    <interserver_http_port>{{.InterserverPort}}</interserver_http_port>
    <zookeeper>
{{- range .ZooKeeper}}
        <node><host>{{x .Host}}</host><port>{{.Port}}</port></node>
{{- end}}
        <session_timeout_ms>{{.SessionTimeoutMs}}</session_timeout_ms>
    </zookeeper>
    <remote_servers>
        <{{.Cluster}}>
            <shard>
                <internal_replication>true</internal_replication>
{{- range .Replicas}}
                <replica><host>{{x .Host}}</host><port>{{.Port}}</port></replica>
{{- end}}
            </shard>
        </{{.Cluster}}>
    </remote_servers>
    <distributed_ddl>
        <path>/clickhouse/task_queue/ddl</path>
    </distributed_ddl>
{{- end}}
</yandex>
`))

// usersXML has one passwordless user, reachable from loopback only. Profile settings
// must exist in every supported version: an unknown one makes the server refuse the
// query, so nothing newer than 18.16 goes here.
const usersXML = `<?xml version="1.0"?>
<!-- Written by gauntlet's pkg/chlocal on every start: edits are overwritten. -->
<yandex>
    <profiles>
        <default>
            <max_memory_usage>4000000000</max_memory_usage>
            <max_threads>2</max_threads>
            <use_uncompressed_cache>0</use_uncompressed_cache>
            <log_queries>0</log_queries>
            <!-- How often an idle connection checks for shutdown: the default 10 s
                 makes every Stop with an open client take 10 s. -->
            <poll_interval>1</poll_interval>
        </default>
    </profiles>
    <users>
        <default>
            <password></password>
            <networks>
                <ip>127.0.0.1</ip>
                <ip>::1</ip>
            </networks>
            <profile>default</profile>
            <quota>default</quota>
        </default>
    </users>
    <quotas>
        <default></default>
    </quotas>
</yandex>
`

type configValues struct {
	TCPPort, HTTPPort                                         int
	ServerLog, ErrorLog, Data, Tmp, UserFiles, Schemas, Users string
	Instance                                                  string
	Replication                                               *replicationValues
}

// replicationValues is the replicated part of config.xml.
type replicationValues struct {
	InterserverPort         int
	ZooKeeper, Replicas     []hostPort
	SessionTimeoutMs        int64
	Cluster, Shard, Replica string
}

type hostPort struct {
	Host string
	Port int
}

// splitHostPorts parses host:port addresses.
func splitHostPorts(addrs []string) ([]hostPort, error) {
	out := make([]hostPort, 0, len(addrs))
	for _, a := range addrs {
		h, p, err := net.SplitHostPort(a)
		if err != nil {
			return nil, err
		}
		port, err := strconv.Atoi(p)
		if err != nil {
			return nil, fmt.Errorf("port of %s: %w", a, err)
		}
		out = append(out, hostPort{h, port})
	}
	return out, nil
}

func xmlText(s string) (string, error) {
	var b bytes.Buffer
	if err := xml.EscapeText(&b, []byte(s)); err != nil {
		return "", err
	}
	return b.String(), nil
}

// writeConfig writes config.xml and users.xml into dir and creates the folders they
// name. dir must be absolute; repl is nil for a single server.
func writeConfig(dir, instance string, tcpPort, httpPort int, repl *replicationValues) error {
	in := func(rel string) string {
		p := filepath.Join(dir, rel)
		if rel[len(rel)-1] == '/' {
			p += "/" // ClickHouse wants paths of folders to end with a slash
		}
		return p
	}
	for _, d := range []string{logDir, dataDir, tmpDir, userFilesDir, schemasDir} {
		if err := os.MkdirAll(in(d), 0o755); err != nil {
			return fmt.Errorf("write clickhouse config: %w", err)
		}
	}
	var b bytes.Buffer
	err := configTemplate.Execute(&b, configValues{
		TCPPort:   tcpPort,
		HTTPPort:  httpPort,
		ServerLog: in(serverLog),
		ErrorLog:  in(errorLog),
		Data:      in(dataDir),
		Tmp:       in(tmpDir),
		UserFiles: in(userFilesDir),
		Schemas:   in(schemasDir),
		Users:     in(usersFile),
		Instance:  instance,
		// Cluster names an XML element: Replication.validate allows only identifiers.
		Replication: repl,
	})
	if err != nil {
		return fmt.Errorf("write clickhouse config: %w", err)
	}
	if err := os.WriteFile(in(configFile), b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write clickhouse config: %w", err)
	}
	users := usersXML
	if repl != nil {
		// An insert into a Distributed table goes to the local replica synchronously
		// anyway (one shard, internal_replication); this keeps it synchronous should a
		// client prefer a remote replica, so an acknowledged insert is never only queued.
		users = strings.Replace(users, "<default>\n", "<default>\n            <insert_distributed_sync>1</insert_distributed_sync>\n", 1)
	}
	if err := os.WriteFile(in(usersFile), []byte(users), 0o644); err != nil {
		return fmt.Errorf("write clickhouse users config: %w", err)
	}
	return nil
}
