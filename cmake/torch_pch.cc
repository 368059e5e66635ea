// Translation unit that carries the precompiled torch header.
