package plans_test

type call struct{ service, tool string }

// script is a fixed call sequence over shop's services: n calls, cycling services and tools.
func script(n int) []call {
	tools := []string{"get", "list", "update"}
	out := make([]call, n)
	for i := range out {
		s := shopServices[i%len(shopServices)]
		out[i] = call{s, s + "." + tools[(i/len(shopServices))%len(tools)]}
	}
	return out
}
