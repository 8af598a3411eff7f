package shop

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

// observationTypes is every observation the shop makes: Reset's and each tool call's.
var observationTypes = []any{resetObs{}, errObs{}, truncObs{}, searchObs{}, productObs{}, stockObs{}, orderObs{}, payObs{}, shipObs{}, balanceObs{}, waitObs{}}

// fill sets every field of v (a struct, through reflection, so a field added later is
// covered too) from s, n and set: strings to s, integers to n, bools to set, slices to two
// filled elements.
func fill(v reflect.Value, s string, n int64, set bool) {
	switch v.Kind() {
	case reflect.String:
		v.SetString(s)
	case reflect.Int, reflect.Int64:
		v.SetInt(n)
	case reflect.Uint32:
		v.SetUint(uint64(n) & 0xffffffff)
	case reflect.Bool:
		v.SetBool(set)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := 0; i < 2; i++ {
			fill(v.Index(i), s, n+int64(i), set)
		}
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			fill(v.Field(i), s, n, set)
		}
	default:
		panic("fill: no rule for " + v.Kind().String())
	}
}

// checkSame fails unless marshal encodes v exactly as json.Marshal does.
func checkSame(t *testing.T, v any) {
	t.Helper()
	if _, ok := v.(jsonAppender); !ok {
		t.Fatalf("%T does not encode itself", v)
	}
	want, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if got := marshal(v); !bytes.Equal(got, want) {
		t.Errorf("%T:\n got %s\nwant %s", v, got, want)
	}
}

func TestEveryObservationMatchesJSON(t *testing.T) {
	for _, zero := range observationTypes {
		checkSame(t, zero) // omitempty fields left out, nil slices as null
		for _, c := range []struct {
			s   string
			n   int64
			set bool
		}{
			{"sku-1", 42, true},
			{`<a href="x">&amp;</a> \ é 日本 ` + "\u2028\t\x01", -9_223_372_036_854_775_808, false},
			{"", 0, true},
			{"\xff\xfe invalid utf-8", 9_223_372_036_854_775_807, true},
		} {
			v := reflect.New(reflect.TypeOf(zero)).Elem()
			fill(v, c.s, c.n, c.set)
			checkSame(t, v.Interface())
		}
	}
	checkSame(t, &errObs{Error: "bad args", Suggestion: "call it as x"}) // parse errors are pointers
	checkSame(t, searchObs{OK: true, Results: []hit{}})                  // no hits: []
}

func FuzzObservationsMatchJSON(f *testing.F) {
	f.Add("sku-12", "Red mug", int64(1999), uint32(503), true)
	f.Add("<&>\"\\", "\u2028", int64(-1), uint32(0), false)
	f.Fuzz(func(t *testing.T, s1, s2 string, n int64, status uint32, ok bool) {
		for _, v := range []any{
			errObs{OK: ok, Status: status, Error: s1, RetryAfterMs: n, Rule: s2, Reason: s1, Suggestion: s2},
			truncObs{Truncated: ok, Body: s1 + s2},
			searchObs{OK: ok, Total: int(n), Results: []hit{{SKU: s1, Name: s2, Price: n}}},
			productObs{OK: ok, SKU: s1, Name: s2, Category: s1, Price: n},
			stockObs{OK: ok, SKU: s2, Stock: n},
			orderObs{OK: ok, OrderID: s1, SKU: s2, Qty: n, Amount: -n, OrderStatus: s1},
			payObs{OK: ok, OrderID: s2, OrderStatus: s1, Amount: n, Balance: n / 3},
			shipObs{OK: ok, OrderID: s1, OrderStatus: s2},
			balanceObs{OK: ok, Balance: n},
			waitObs{OK: ok, WaitedMs: n, ElapsedMs: int64(status)},
		} {
			checkSame(t, v)
		}
	})
}

// BenchmarkMarshalObservation encodes a search result (the largest observation) and a
// stock reply by hand and with json.Marshal.
func BenchmarkMarshalObservation(b *testing.B) {
	search := searchObs{OK: true, Total: 3, Results: []hit{{"sku-1", "Red mug", 1299}, {"sku-2", "Blue mug", 1399}, {"sku-3", "Mug lid", 299}}}
	stock := stockObs{OK: true, SKU: "sku-3458", Stock: 1}
	for _, c := range []struct {
		name string
		enc  func(any) []byte
	}{
		{"hand", marshal},
		{"encoding-json", func(v any) []byte { b, _ := json.Marshal(v); return b }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				c.enc(search)
				c.enc(stock)
			}
		})
	}
}
