"""Making SWE tasks: mutants of real packages' functions (`build`, `mutation`, `package_repo`) and
the images they run in (`images`)."""
