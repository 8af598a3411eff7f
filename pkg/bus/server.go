package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// ServerConfig configures the embedded NATS server.
type ServerConfig struct {
	// StoreDir holds JetStream's files.
	StoreDir string
	// Host and Port for outside clients (gauntlet run, split-mode services); Port -1
	// accepts in-process connections only.
	Host string
	Port int
	// MaxStore caps JetStream's disk use (bytes); 0 lets the server choose.
	MaxStore int64
}

// Server is an embedded nats-server with JetStream, run as a lifecycle.Service.
type Server struct {
	cfg ServerConfig
	log *slog.Logger
	ns  *server.Server
}

// NewServer allocates an embedded server; Starting starts it.
func NewServer(cfg ServerConfig, log *slog.Logger) *Server {
	return &Server{cfg: cfg, log: log}
}

// Starting starts the server and waits until it accepts connections.
func (s *Server) Starting(ctx context.Context) error {
	if err := os.MkdirAll(s.cfg.StoreDir, 0o755); err != nil {
		return fmt.Errorf("create jetstream dir: %w", err)
	}
	opts := &server.Options{
		ServerName:            "gauntlet",
		Host:                  s.cfg.Host,
		Port:                  s.cfg.Port,
		JetStream:             true,
		StoreDir:              filepath.Clean(s.cfg.StoreDir),
		JetStreamMaxStore:     s.cfg.MaxStore,
		NoSigs:                true,
		MaxPayload:            MaxPayload,
		DisableShortFirstPing: true,
	}
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	if s.cfg.Port < 0 {
		opts.DontListen = true
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("configure nats server: %w", err)
	}
	ns.SetLoggerV2(&natsLogger{log: s.log}, false, false, false)
	s.ns = ns
	go ns.Start()
	deadline := 30 * time.Second
	if d, ok := ctx.Deadline(); ok {
		deadline = time.Until(d)
	}
	if !ns.ReadyForConnections(deadline) {
		return errors.New("nats server not ready for connections within the deadline")
	}
	s.log.Info("nats server ready", "listen", s.ClientURL(), "store_dir", s.cfg.StoreDir)
	return nil
}

// Running waits for the stop.
func (s *Server) Running(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

// Stopping shuts the server down and waits for it.
func (s *Server) Stopping(ctx context.Context) error {
	if s.ns == nil {
		return nil
	}
	s.ns.Shutdown()
	done := make(chan struct{})
	go func() { s.ns.WaitForShutdown(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("nats server shutdown: %w", ctx.Err())
	}
}

// ClientURL is the URL outside clients use ("" when not listening).
func (s *Server) ClientURL() string {
	if s.ns == nil || s.cfg.Port < 0 {
		return ""
	}
	return s.ns.ClientURL()
}

// ConnectOption returns the option that connects a client in-process, without TCP.
func (s *Server) ConnectOption() nats.Option { return nats.InProcessServer(s.ns) }

// natsLogger routes nats-server's log through slog; debug and trace stay off.
type natsLogger struct{ log *slog.Logger }

func (l *natsLogger) Noticef(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Warnf(format string, v ...any)   { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Fatalf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Errorf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Debugf(format string, v ...any)  {}
func (l *natsLogger) Tracef(format string, v ...any)  {}
