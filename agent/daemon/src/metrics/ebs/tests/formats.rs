use super::super::render::go_float;

#[test]
fn numbers_are_written_as_the_go_client_writes_them() {
    for (v, want) in [
        (0.0, "0"),
        (1.0, "1"),
        (10.0, "10"),
        (1.5, "1.5"),
        (0.0025, "0.0025"),
        (0.0001, "0.0001"),
        (0.000128, "0.000128"),
        (8e-6, "8e-06"),
        (1.6e-5, "1.6e-05"),
        (1e-5, "1e-05"),
        (123456.0, "123456"),
        (999999.0, "999999"),
        (1e6, "1e+06"),
        (4194304.0, "4.194304e+06"),
        (1.5e7, "1.5e+07"),
        (u64::MAX as f64, "1.8446744073709552e+19"),
        (1e100, "1e+100"),
        (-2.5e-7, "-2.5e-07"),
        (f64::INFINITY, "+Inf"),
    ] {
        assert_eq!(go_float(v), want, "{v:e}");
    }
    // Bin bounds are microseconds divided as upstream divides them.
    assert_eq!(go_float(16.0 / 1e6), "1.6e-05");
    assert_eq!(go_float(1_000_000.0 / 1e6), "1");
    assert_eq!(go_float(524_288.0 / 1e6), "0.524288");
}
