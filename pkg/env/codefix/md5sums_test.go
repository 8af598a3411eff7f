package codefix

import (
	"maps"
	"testing"
)

// TestParseMD5Sums reads GNU md5sum's escaped lines back to the exact names.
func TestParseMD5Sums(t *testing.T) {
	out := "d41d8cd98f00b204e9800998ecf8427e  ./a b\n" +
		"\\d41d8cd98f00b204e9800998ecf8427e  ./back\\\\slash\n" +
		"\\d41d8cd98f00b204e9800998ecf8427e  ./new\\nline\n" +
		"\\d41d8cd98f00b204e9800998ecf8427e  ./lit\\\\n\n" +
		"\\d41d8cd98f00b204e9800998ecf8427e  ./cr\\r\n" +
		"0cc175b9c0f1b6a831c399e269772661  ./\xff\n"
	want := map[string]string{
		"a b":        "d41d8cd98f00b204e9800998ecf8427e",
		`back\slash`: "d41d8cd98f00b204e9800998ecf8427e",
		"new\nline":  "d41d8cd98f00b204e9800998ecf8427e",
		`lit\n`:      "d41d8cd98f00b204e9800998ecf8427e",
		"cr\r":       "d41d8cd98f00b204e9800998ecf8427e",
		"\xff":       "0cc175b9c0f1b6a831c399e269772661",
	}
	if got := parseMD5Sums([]byte(out)); !maps.Equal(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
}
