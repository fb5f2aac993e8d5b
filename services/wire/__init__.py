"""Wire formats every service shares: plans as JSON/protobuf (codec), plans in table slices (planwire)."""
