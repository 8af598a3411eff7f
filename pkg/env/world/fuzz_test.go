package world

import (
	"errors"
	"regexp"
	"strings"
	"testing"
)

var placeRE = regexp.MustCompile(`^f\.yaml:\d+:\d+: \S+: `)

// FuzzLoad: any bytes load or fail without a panic, and every error names a place (file,
// line, column and field).
func FuzzLoad(f *testing.F) {
	f.Add([]byte(small))
	b, err := builtinFS.ReadFile("builtin/bank.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte("name: x\nservices: [a]\ntools: [{name: t, description: d}]\nsuccess: 'true'\n"))
	f.Add([]byte("a: &x [*x]\n"))
	f.Add([]byte("name: x\nentities: {e: {prefix: e-, count: {uniform: [1, 3]}, fields: {f: {type: int, expr: 'i * 2'}}}}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, err := Load("f.yaml", data)
		if err == nil {
			return
		}
		if !errors.Is(err, ErrInvalid) {
			t.Fatalf("error does not wrap ErrInvalid: %v", err)
		}
		var errs []error
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			errs = j.Unwrap()
		} else {
			errs = []error{err}
		}
		for _, e := range errs {
			var le *LoadError
			if !errors.As(e, &le) || le.Line < 1 || le.Col < 1 {
				t.Fatalf("error without a place: %v", e)
			}
			if !placeRE.MatchString(e.Error()) && !strings.HasPrefix(e.Error(), "f.yaml:") {
				t.Fatalf("error does not start with its place: %q", e.Error())
			}
		}
	})
}
