"""``--mode auto``: calibrate on this machine (cost of a verify against its width,
acceptance replayed from one forward), predict each candidate's speed, choose."""
