package reward

import "flag"

// RegisterFlags declares the reward.* flags on fs with their defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.IntVar(&c.Subscribers, "reward.subscribers", 2, "score handlers per reward instance")
}
