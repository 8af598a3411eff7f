package envapi

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"connectrpc.com/connect"
	"gopkg.in/yaml.v3"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
)

// Tenant is one customer of the env API: its name (which names its run, "api-<name>", in
// ClickHouse) and its quota of concurrent episodes.
type Tenant struct {
	Name string
	// MaxEpisodes caps the tenant's live episodes; 0 means the server default.
	MaxEpisodes int
}

// tenantsFile is the YAML of --envapi.tokens:
//
//	tenants:
//	  - name: acme
//	    tokens: [s3cret-1, s3cret-2]
//	    max_episodes: 512
type tenantsFile struct {
	Tenants []struct {
		Name        string   `yaml:"name"`
		Tokens      []string `yaml:"tokens"`
		MaxEpisodes int      `yaml:"max_episodes"`
	} `yaml:"tenants"`
}

// Tokens maps API tokens (by their SHA-256, so a map lookup leaks nothing about a token's
// prefix) to tenants.
type Tokens struct {
	byHash map[[32]byte]*Tenant
}

// ParseTokens reads a tenants file; every problem is reported, naming its entry.
func ParseTokens(data []byte) (*Tokens, error) {
	var f tenantsFile
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("tenants file: %w", err)
	}
	t := &Tokens{byHash: map[[32]byte]*Tenant{}}
	var errs []error
	names := map[string]bool{}
	for i, e := range f.Tenants {
		if err := bus.ValidToken(fmt.Sprintf("tenants[%d].name", i), e.Name); err != nil {
			errs = append(errs, err)
			continue
		}
		if names[e.Name] {
			errs = append(errs, fmt.Errorf("tenants[%d].name: %q appears twice", i, e.Name))
		}
		names[e.Name] = true
		if e.MaxEpisodes < 0 {
			errs = append(errs, fmt.Errorf("tenants[%d].max_episodes: %d must not be negative", i, e.MaxEpisodes))
		}
		if len(e.Tokens) == 0 {
			errs = append(errs, fmt.Errorf("tenants[%d].tokens: at least one token is required", i))
		}
		ten := &Tenant{Name: e.Name, MaxEpisodes: e.MaxEpisodes}
		for j, tok := range e.Tokens {
			if len(tok) < 16 {
				errs = append(errs, fmt.Errorf("tenants[%d].tokens[%d]: %d characters is shorter than 16", i, j, len(tok)))
				continue
			}
			h := sha256.Sum256([]byte(tok))
			if _, dup := t.byHash[h]; dup {
				errs = append(errs, fmt.Errorf("tenants[%d].tokens[%d]: the token is used twice", i, j))
				continue
			}
			t.byHash[h] = ten
		}
	}
	if len(f.Tenants) == 0 {
		errs = append(errs, errors.New("tenants file: no tenants"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return t, nil
}

// LoadTokens reads the tenants file at path.
func LoadTokens(path string) (*Tokens, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("envapi.tokens: %w", err)
	}
	t, err := ParseTokens(data)
	if err != nil {
		return nil, fmt.Errorf("envapi.tokens %s: %w", path, err)
	}
	return t, nil
}

// DevTokens makes one tenant, "default", for a local stack started without a tenants
// file. Its token is the one in path: made (random, mode 0600) only when the file is
// missing, and kept across restarts, so a trainer that read it is not locked out by the
// next start. A file that holds no usable token is an error naming it.
func DevTokens(path string, log *slog.Logger) (*Tokens, string, error) {
	tok, err := secretFile(path, 24, validDevToken, log)
	if err != nil {
		return nil, "", fmt.Errorf("dev token: %w", err)
	}
	t := &Tokens{byHash: map[[32]byte]*Tenant{sha256.Sum256([]byte(tok)): {Name: "default"}}}
	return t, tok, nil
}

// OpenTokens returns the tokens the env API of configuration c accepts: the tenants file
// when c names one, else the dev token (made when missing). The web console checks its
// actions against the same tokens.
func OpenTokens(c Config, log *slog.Logger) (*Tokens, error) {
	if c.TokensFile != "" {
		return LoadTokens(c.TokensFile)
	}
	t, _, err := DevTokens(c.DevTokenPath, log)
	return t, err
}

// Lookup returns the tenant of a token, or nil.
func (t *Tokens) Lookup(token string) *Tenant {
	if token == "" {
		return nil
	}
	return t.byHash[sha256.Sum256([]byte(token))]
}

type tenantKey struct{}

// tenantOf returns the tenant the guard put in ctx.
func tenantOf(ctx context.Context) *Tenant {
	t, _ := ctx.Value(tenantKey{}).(*Tenant)
	return t
}

// auth turns "Authorization: Bearer <token>" into a tenant, and refuses calls without a
// valid one (401 over HTTP, UNAUTHENTICATED over gRPC). The guard asks it before connect
// reads the request.
type auth struct{ tokens *Tokens }

func (a auth) tenant(h interface{ Get(string) string }) (*Tenant, error) {
	v := h.Get("Authorization")
	tok, ok := strings.CutPrefix(v, "Bearer ")
	if !ok {
		if v == "" {
			return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("missing Authorization: Bearer <token> header"))
		}
		return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("the Authorization header must be \"Bearer <token>\""))
	}
	t := a.tokens.Lookup(strings.TrimSpace(tok))
	if t == nil {
		return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("unknown API token"))
	}
	return t, nil
}
