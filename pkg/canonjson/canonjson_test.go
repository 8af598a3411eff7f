package canonjson

import (
	"encoding/json"
	"testing"
)

func TestAppendStringIsValidAndMatchesEncodingJSONOnPlainText(t *testing.T) {
	for _, s := range []string{"", "sku-3f2a", `a"b\c`, "tab\there", "\x01", "é€😀", "bad\xffutf8", "<&>"} {
		got := AppendString(nil, s)
		if !json.Valid(got) {
			t.Fatalf("AppendString(%q) = %s: not valid JSON", s, got)
		}
		var back string
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(s) // same decoded value, whatever the escapes
		var wantBack string
		_ = json.Unmarshal(want, &wantBack)
		if back != wantBack {
			t.Fatalf("AppendString(%q) decodes to %q, want %q", s, back, wantBack)
		}
	}
}

func TestAppendFloat(t *testing.T) {
	cases := map[float64]string{0: "0", 0.25: "0.25", 1e-7: "1e-7", 1.5e-9: "1.5e-9", 1e21: "1e+21", 123456.5: "123456.5", -3: "-3"}
	for f, want := range cases {
		got, err := AppendFloat(nil, f)
		if err != nil || string(got) != want {
			t.Errorf("AppendFloat(%v) = %s, %v; want %s", f, got, err, want)
		}
	}
	if _, err := AppendFloat(nil, 1/zero()); err == nil {
		t.Error("AppendFloat(+Inf) accepted")
	}
}

func zero() float64 { return 0 }
